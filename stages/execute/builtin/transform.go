package builtin

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// jsonTransform selects part of a document (a JSON pointer), keeps some keys
// of an object, and applies one operation: identity, keys, length or sort.
func jsonTransform(_ context.Context, params json.RawMessage) (json.RawMessage, error) {
	var p struct {
		Data    any      `json:"data"`
		Pointer string   `json:"pointer"`
		Pick    []string `json:"pick"`
		Op      string   `json:"op"`
	}
	if err := decode(params, &p); err != nil {
		return nil, err
	}
	v, err := resolve(p.Data, p.Pointer)
	if err != nil {
		return nil, err
	}
	if p.Pick != nil {
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, invalid("pick applies to an object, the value is %s", jsonType(v))
		}
		picked := make(map[string]any, len(p.Pick))
		for _, k := range p.Pick {
			if x, ok := obj[k]; ok {
				picked[k] = x
			}
		}
		v = picked
	}
	if v, err = apply(p.Op, v); err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"result": v})
}

// resolve evaluates an RFC 6901 JSON pointer.
func resolve(doc any, pointer string) (any, error) {
	if pointer == "" {
		return doc, nil
	}
	if !strings.HasPrefix(pointer, "/") {
		return nil, invalid("pointer %q must start with /", pointer)
	}
	cur := doc
	for _, raw := range strings.Split(pointer[1:], "/") {
		tok := strings.ReplaceAll(strings.ReplaceAll(raw, "~1", "/"), "~0", "~")
		switch c := cur.(type) {
		case map[string]any:
			next, ok := c[tok]
			if !ok {
				return nil, invalid("pointer %q: no key %q", pointer, tok)
			}
			cur = next
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) || (len(tok) > 1 && tok[0] == '0') {
				return nil, invalid("pointer %q: no index %q in an array of %d", pointer, tok, len(c))
			}
			cur = c[i]
		default:
			return nil, invalid("pointer %q: cannot index into %s", pointer, jsonType(cur))
		}
	}
	return cur, nil
}

func apply(op string, v any) (any, error) {
	switch op {
	case "", "identity":
		return v, nil
	case "keys":
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, invalid("keys applies to an object, the value is %s", jsonType(v))
		}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		return keys, nil
	case "length":
		switch t := v.(type) {
		case map[string]any:
			return len(t), nil
		case []any:
			return len(t), nil
		case string:
			return utf8.RuneCountInString(t), nil
		}
		return nil, invalid("length applies to an object, array or string, the value is %s", jsonType(v))
	case "sort":
		arr, ok := v.([]any)
		if !ok {
			return nil, invalid("sort applies to an array, the value is %s", jsonType(v))
		}
		return sortValues(arr)
	}
	return nil, invalid("unknown op %q (identity, keys, length, sort)", op)
}

func sortValues(arr []any) ([]any, error) {
	out := slices.Clone(arr)
	allStrings, allNumbers := true, true
	for _, x := range out {
		_, isStr := x.(string)
		_, isNum := x.(json.Number)
		allStrings = allStrings && isStr
		allNumbers = allNumbers && isNum
	}
	switch {
	case allStrings:
		slices.SortStableFunc(out, func(a, b any) int { return strings.Compare(a.(string), b.(string)) })
	case allNumbers:
		var err error
		slices.SortStableFunc(out, func(a, b any) int {
			x, e1 := a.(json.Number).Float64()
			y, e2 := b.(json.Number).Float64()
			if e1 != nil || e2 != nil {
				err = invalid("sort: number out of range")
			}
			switch {
			case x < y:
				return -1
			case x > y:
				return 1
			}
			return 0
		})
		if err != nil {
			return nil, err
		}
	default:
		return nil, invalid("sort needs an array of only strings or only numbers")
	}
	return out, nil
}

func jsonType(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return "a value"
}
