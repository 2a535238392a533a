package verify

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// coerce converts string values to the type the output schema asks for at
// the same place: number, integer, boolean, or an RFC 3339 date-time. It
// follows properties, items and additionalProperties; what it cannot convert
// it leaves for schema validation to report.
func coerce(result, schema []byte) ([]byte, bool) {
	var doc, sch any
	dec := json.NewDecoder(bytes.NewReader(result))
	dec.UseNumber()
	if dec.Decode(&doc) != nil || json.Unmarshal(schema, &sch) != nil {
		return result, false
	}
	out, changed := coerceValue(doc, sch)
	if !changed {
		return result, false
	}
	b, err := json.Marshal(out)
	if err != nil {
		return result, false
	}
	return b, true
}

func coerceValue(v, schema any) (any, bool) {
	s, ok := schema.(map[string]any)
	if !ok {
		return v, false
	}
	switch t := v.(type) {
	case map[string]any:
		changed := false
		props, _ := s["properties"].(map[string]any)
		for k, x := range t {
			sub, ok := props[k]
			if !ok {
				sub = s["additionalProperties"]
			}
			if nx, c := coerceValue(x, sub); c {
				t[k], changed = nx, true
			}
		}
		return t, changed
	case []any:
		changed := false
		for i, x := range t {
			if nx, c := coerceValue(x, s["items"]); c {
				t[i], changed = nx, true
			}
		}
		return t, changed
	case string:
		return coerceString(t, s)
	}
	return v, false
}

func types(s map[string]any) []string {
	switch t := s["type"].(type) {
	case string:
		return []string{t}
	case []any:
		var out []string
		for _, x := range t {
			if str, ok := x.(string); ok {
				out = append(out, str)
			}
		}
		return out
	}
	return nil
}

func coerceString(v string, s map[string]any) (any, bool) {
	ts := types(s)
	for _, t := range ts {
		if t == "string" {
			if f, _ := s["format"].(string); f == "date-time" {
				if d, ok := parseTime(v); ok && d != v {
					return d, true
				}
			}
			return v, false // a string is acceptable as it is
		}
	}
	trimmed := strings.TrimSpace(v)
	for _, t := range ts {
		switch t {
		case "integer":
			if _, err := strconv.ParseInt(trimmed, 10, 64); err == nil {
				return json.Number(trimmed), true
			}
		case "number":
			if f, err := strconv.ParseFloat(trimmed, 64); err == nil {
				return json.Number(strconv.FormatFloat(f, 'g', -1, 64)), true
			}
		case "boolean":
			if b, err := strconv.ParseBool(trimmed); err == nil {
				return b, true
			}
		}
	}
	return v, false
}

var timeLayouts = []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02 15:04:05", "2006-01-02", time.RFC1123Z, time.RFC1123}

func parseTime(v string) (string, bool) {
	for _, l := range timeLayouts {
		if t, err := time.Parse(l, strings.TrimSpace(v)); err == nil {
			return t.UTC().Format(time.RFC3339Nano), true
		}
	}
	return "", false
}
