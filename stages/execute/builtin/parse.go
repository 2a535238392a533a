package builtin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"
)

// Limits of the parse builtins. Text arrives through the request, so the
// validate stage's string limit usually binds first; these hold for callers
// that raise it.
const (
	maxParseBytes = 1 << 20
	maxParseDepth = 64
	// maxYAMLNodes bounds the document as it would be after alias
	// expansion: a few hundred bytes of nested aliases ("billion laughs")
	// otherwise expand to gigabytes.
	maxYAMLNodes = 100_000
	// maxYAMLBytes bounds the scalar bytes after expansion, for a long
	// string aliased many times.
	maxYAMLBytes = 2 * maxParseBytes
)

// parseJSON parses the text parameter as one JSON value, numbers kept exact.
func parseJSON(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
	text, err := parseText(params)
	if err != nil {
		return nil, err
	}
	// Walk the tokens first: depth is refused before any value is built.
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	depth := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, invalid("text is not JSON: %v", err)
		}
		if d, ok := tok.(json.Delim); ok {
			if d == '{' || d == '[' {
				if depth++; depth > maxParseDepth {
					return nil, tooLarge("text nests deeper than %d levels", maxParseDepth)
				}
			} else {
				depth--
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dec = json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, invalid("text is not JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, invalid("text holds more than one JSON value")
	}
	return json.Marshal(map[string]any{"value": v})
}

// parseYAML parses the text parameter as one YAML document and returns it as
// JSON. The document is first read into a node tree, which keeps aliases as
// references, and the tree is measured as if expanded before anything is
// decoded, so alias bombs and cycles are refused in time proportional to the
// text.
func parseYAML(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
	text, err := parseText(params)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(text))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			return json.Marshal(map[string]any{"value": nil}) // an empty document is null
		}
		return nil, invalid("text is not YAML: %v", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		if err != nil {
			return nil, invalid("text is not YAML: %v", err)
		}
		return nil, invalid("text holds more than one YAML document")
	}
	if err := measureYAML(&doc); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var v any
	if err := doc.Decode(&v); err != nil {
		return nil, invalid("text is not YAML: %v", err)
	}
	j, err := jsonValue(v)
	if err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"value": j})
}

func parseText(params json.RawMessage) ([]byte, error) {
	var p struct {
		Text *string `json:"text"`
	}
	if err := decode(params, &p); err != nil {
		return nil, err
	}
	if p.Text == nil {
		return nil, invalid("text is required")
	}
	if len(*p.Text) > maxParseBytes {
		return nil, tooLarge("text is %d bytes, the limit is %d", len(*p.Text), maxParseBytes)
	}
	return []byte(*p.Text), nil
}

// yamlSize is a node's size and depth once its aliases are expanded.
type yamlSize struct{ nodes, bytes, depth int }

// measureYAML refuses a node tree whose expansion would exceed maxYAMLNodes
// nodes, maxYAMLBytes bytes of scalars or maxParseDepth levels, or that
// refers to itself. Each node is
// measured once (anchored nodes are memoized), and every sum stops at the
// limit, so the walk is linear in the text and never overflows.
func measureYAML(root *yaml.Node) error {
	memo := map[*yaml.Node]yamlSize{}
	active := map[*yaml.Node]bool{}
	var walk func(n *yaml.Node, level int) (yamlSize, error)
	walk = func(n *yaml.Node, level int) (yamlSize, error) {
		if level > maxParseDepth+2 { // the document node and the alias hop add levels
			return yamlSize{}, tooLarge("YAML nests deeper than %d levels", maxParseDepth)
		}
		if s, ok := memo[n]; ok {
			return s, nil
		}
		if active[n] {
			return yamlSize{}, invalid("YAML alias refers to a node that contains it")
		}
		active[n] = true
		defer delete(active, n)
		var s yamlSize
		if n.Kind == yaml.AliasNode {
			if n.Alias == nil {
				return yamlSize{}, invalid("YAML alias without an anchor")
			}
			// An alias stands for its anchor's whole subtree.
			sub, err := walk(n.Alias, level)
			if err != nil {
				return yamlSize{}, err
			}
			s = sub
		} else {
			s.nodes, s.bytes = 1, len(n.Value)
			for _, c := range n.Content {
				sub, err := walk(c, level+1)
				if err != nil {
					return yamlSize{}, err
				}
				s.nodes += sub.nodes
				s.bytes += sub.bytes
				s.depth = max(s.depth, sub.depth)
				if s.nodes > maxYAMLNodes {
					return yamlSize{}, tooLarge("YAML expands to more than %d nodes (aliases counted in full)", maxYAMLNodes)
				}
				if s.bytes > maxYAMLBytes {
					return yamlSize{}, tooLarge("YAML expands to more than %d bytes (aliases counted in full)", maxYAMLBytes)
				}
			}
			if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
				s.depth++
			}
			if s.depth > maxParseDepth {
				return yamlSize{}, tooLarge("YAML nests deeper than %d levels (aliases counted in full)", maxParseDepth)
			}
		}
		memo[n] = s
		return s, nil
	}
	_, err := walk(root, 0)
	return err
}

// jsonValue turns a decoded YAML value into one encoding/json writes the way
// JSON readers expect: keys become strings, timestamps RFC 3339 strings, and
// numbers JSON cannot hold are refused rather than mangled.
func jsonValue(v any) (any, error) {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			j, err := jsonValue(x)
			if err != nil {
				return nil, err
			}
			t[k] = j
		}
		return t, nil
	case map[any]any:
		out := make(map[string]any, len(t))
		for k, x := range t {
			ks, err := keyString(k)
			if err != nil {
				return nil, err
			}
			if _, dup := out[ks]; dup {
				return nil, invalid("YAML keys collide as JSON object keys: %q", ks)
			}
			j, err := jsonValue(x)
			if err != nil {
				return nil, err
			}
			out[ks] = j
		}
		return out, nil
	case []any:
		for i, x := range t {
			j, err := jsonValue(x)
			if err != nil {
				return nil, err
			}
			t[i] = j
		}
		return t, nil
	case float64:
		if math.IsInf(t, 0) || math.IsNaN(t) {
			return nil, invalid("YAML number %v has no JSON form", t)
		}
		return t, nil
	case time.Time:
		return t.Format(time.RFC3339Nano), nil
	case nil, bool, string, int, int64, uint64:
		return t, nil
	default:
		return nil, invalid("YAML value of type %T has no JSON form", v)
	}
}

func keyString(k any) (string, error) {
	switch t := k.(type) {
	case string:
		return t, nil
	case nil:
		return "null", nil
	case bool:
		return strconv.FormatBool(t), nil
	case int, int64, uint64:
		return fmt.Sprint(t), nil
	case float64:
		if math.IsInf(t, 0) || math.IsNaN(t) {
			return "", invalid("YAML key %v has no JSON form", t)
		}
		return strconv.FormatFloat(t, 'g', -1, 64), nil
	case time.Time:
		return t.Format(time.RFC3339Nano), nil
	default:
		return "", invalid("YAML mapping keys must be scalars, not %s", typeName(k))
	}
}

func typeName(v any) string {
	switch v.(type) {
	case map[string]any, map[any]any:
		return "mappings"
	case []any:
		return "sequences"
	}
	return fmt.Sprintf("%T", v)
}
