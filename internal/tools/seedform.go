package tools

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/schemas"
)

// The specification's form of a manifest (seed 002, 5.2.1) names some of
// toolgate's members differently and has no member for the rest, which it
// carries in one extension member. Parse takes either form; the registry
// keeps toolgate's own (Native), and SeedForm writes a manifest back in the
// specification's.

// SeedExtension is the member of a manifest in the specification's form
// that holds toolgate's own members the specification has no name for.
const SeedExtension = "x-toolgate"

// seedOnly are the top-level members only the specification's form has: one
// of them makes a document that form.
var seedOnly = []string{"tool_id", "tool_name", "parameters_schema", "result_schema", "execution_config", SeedExtension}

// seedTop are the top-level members of the specification's form.
var seedTop = append([]string{"description", "category", "version", "permissions"}, seedOnly...)

// seedName pairs a member of toolgate's form (a path of member names) with
// the specification's name for the same thing.
type seedName struct {
	native []string
	seed   string // JSON pointer in the specification's form
}

// seedNames are the members both forms name, each under its own name. A
// shared name (version) is listed too: in the specification's form its
// place is the top level, never the extension.
var seedNames = []seedName{
	{[]string{"id"}, "/tool_id"},
	{[]string{"name"}, "/tool_name"},
	{[]string{"description"}, "/description"},
	{[]string{"category"}, "/category"},
	{[]string{"version"}, "/version"},
	{[]string{"input_schema"}, "/parameters_schema"},
	{[]string{"output_schema"}, "/result_schema"},
	{[]string{"permissions"}, "/permissions"},
	{[]string{"limits", "timeout_ms"}, "/execution_config/default_timeout_seconds"},
	{[]string{"limits", "cpu_millicores"}, "/execution_config/default_cpu_millicore_limit"},
	{[]string{"limits", "memory_mb"}, "/execution_config/default_memory_mb_limit"},
	{[]string{"safety", "requires_approval"}, "/execution_config/requires_approval"},
	{[]string{"retry_policy"}, "/execution_config/retry_policy"},
	{[]string{"circuit_breaker"}, "/execution_config/circuit_breaker_config"},
}

// seedManifest is the specification's form, in its order.
type seedManifest struct {
	ToolID           string                     `json:"tool_id"`
	ToolName         string                     `json:"tool_name"`
	Description      string                     `json:"description,omitempty"`
	Category         string                     `json:"category,omitempty"`
	Version          string                     `json:"version"`
	ParametersSchema json.RawMessage            `json:"parameters_schema"`
	ResultSchema     json.RawMessage            `json:"result_schema,omitempty"`
	Permissions      json.RawMessage            `json:"permissions,omitempty"`
	ExecutionConfig  *seedExecutionConfig       `json:"execution_config,omitempty"`
	Extension        map[string]json.RawMessage `json:"x-toolgate,omitempty"`
}

type seedExecutionConfig struct {
	DefaultTimeoutSeconds    *int64          `json:"default_timeout_seconds,omitempty"`
	DefaultCPUMillicoreLimit *int64          `json:"default_cpu_millicore_limit,omitempty"`
	DefaultMemoryMBLimit     *int64          `json:"default_memory_mb_limit,omitempty"`
	RequiresApproval         *bool           `json:"requires_approval,omitempty"`
	RetryPolicy              json.RawMessage `json:"retry_policy,omitempty"`
	CircuitBreakerConfig     json.RawMessage `json:"circuit_breaker_config,omitempty"`
}

// Native returns doc in toolgate's own form: doc itself when it is in that
// form already (or not a JSON object, which Parse then refuses), else the
// specification's form converted. The error is Parse's for a document in
// the specification's form that cannot be converted.
func Native(doc []byte) ([]byte, error) {
	out, _, err := nativeForm(doc)
	return out, err
}

// nativeForm is Native, also returning where each member of the converted
// document came from (native JSON pointer to the specification's), so
// Parse's field errors name the member the author wrote; nil for a
// document in toolgate's form.
func nativeForm(doc []byte) ([]byte, map[string]string, error) {
	var top map[string]json.RawMessage
	if json.Unmarshal(doc, &top) != nil || !slices.ContainsFunc(seedOnly, func(k string) bool { _, ok := top[k]; return ok }) {
		return doc, nil, nil
	}
	if fields := mixedForms(top); len(fields) > 0 {
		return nil, nil, invalid("manifest mixes toolgate's form with the specification's (seed 002, 5.2.1)").WithFields(fields)
	}
	fields, err := schemas.Validate(schemas.SeedManifest(), doc)
	if err != nil {
		return nil, nil, api.WrapError(err, api.InvalidParameters, api.EInvalidManifest, "manifest: %v", err)
	}
	if len(fields) > 0 {
		for i := range fields {
			fields[i].Location = memberLocation(fields[i])
		}
		return nil, nil, invalid("manifest does not match the specification's tool manifest form").WithFields(fields)
	}
	var s seedManifest
	if err := json.Unmarshal(doc, &s); err != nil {
		return nil, nil, invalid("decoding manifest: %v", err)
	}
	out := map[string]any{}
	for k, v := range s.Extension {
		out[k] = v
	}
	origin := map[string]string{}
	set := func(native []string, seed string, v any) {
		if len(native) == 1 {
			out[native[0]] = v
		} else {
			// The extension's object of that name keeps its other members.
			obj := map[string]json.RawMessage{}
			if raw, ok := s.Extension[native[0]]; ok && json.Unmarshal(raw, &obj) != nil {
				return // not an object: kept as written, for the schema to refuse
			}
			b, _ := json.Marshal(v)
			obj[native[1]] = b
			out[native[0]] = obj
			s.Extension[native[0]], _ = json.Marshal(obj)
		}
		origin["/"+strings.Join(native, "/")] = seed
	}
	if s.Extension == nil {
		s.Extension = map[string]json.RawMessage{}
	}
	for _, n := range seedNames {
		var v any
		switch n.seed {
		case "/tool_id":
			v = s.ToolID
		case "/tool_name":
			v = s.ToolName
		case "/description":
			v = s.Description // toolgate's form requires one; the specification's does not
		case "/category":
			if s.Category != "" {
				v = s.Category
			}
		case "/version":
			v = s.Version
		case "/parameters_schema":
			v = s.ParametersSchema
		case "/result_schema":
			v = rawOrNil(s.ResultSchema)
		case "/permissions":
			v = rawOrNil(s.Permissions)
		}
		if e := s.ExecutionConfig; e != nil {
			switch n.seed {
			case "/execution_config/default_timeout_seconds":
				if e.DefaultTimeoutSeconds != nil {
					v = *e.DefaultTimeoutSeconds * 1000
				}
			case "/execution_config/default_cpu_millicore_limit":
				v = ptrOrNil(e.DefaultCPUMillicoreLimit)
			case "/execution_config/default_memory_mb_limit":
				v = ptrOrNil(e.DefaultMemoryMBLimit)
			case "/execution_config/requires_approval":
				v = ptrOrNil(e.RequiresApproval)
			case "/execution_config/retry_policy":
				v = rawOrNil(e.RetryPolicy)
			case "/execution_config/circuit_breaker_config":
				v = rawOrNil(e.CircuitBreakerConfig)
			}
		}
		if v != nil {
			set(n.native, n.seed, v)
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, nil, invalid("converting manifest: %v", err)
	}
	return b, origin, nil
}

func rawOrNil(r json.RawMessage) any {
	if len(r) == 0 {
		return nil
	}
	return r
}

func ptrOrNil[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// mixedForms lists the members of a document in the specification's form
// that belong to toolgate's: one thing named in both forms (both members
// named), a member of toolgate's form outside the extension, and one the
// specification names inside it. An unknown member is left to the schema,
// except at the top level, where it is named by its own path.
func mixedForms(top map[string]json.RawMessage) []api.FieldError {
	var ext map[string]json.RawMessage
	_ = json.Unmarshal(top[SeedExtension], &ext) // not an object: the schema says so
	var exec map[string]json.RawMessage
	_ = json.Unmarshal(top["execution_config"], &exec)
	seedHas := func(ptr string) bool {
		parts := strings.Split(strings.TrimPrefix(ptr, "/"), "/")
		if len(parts) == 1 {
			_, ok := top[parts[0]]
			return ok
		}
		_, ok := exec[parts[1]]
		return ok
	}
	var fields []api.FieldError
	for _, n := range seedNames {
		// Where toolgate's name for it may stand: the top level (unless
		// the name is shared) and the extension.
		var at []string
		if n.seed != "/"+n.native[0] && has(top, n.native) {
			at = append(at, "/"+strings.Join(n.native, "/"))
		}
		if has(ext, n.native) {
			at = append(at, "/"+SeedExtension+"/"+strings.Join(n.native, "/"))
		}
		for _, loc := range at {
			switch {
			case seedHas(n.seed):
				fields = append(fields,
					api.FieldError{Location: loc, Message: fmt.Sprintf("names the same thing as %s; give it once, as %s", n.seed, n.seed)},
					api.FieldError{Location: n.seed, Message: fmt.Sprintf("named a second time by %s", loc)})
			case n.seed == "/execution_config/default_timeout_seconds" && strings.HasPrefix(loc, "/"+SeedExtension):
				// Milliseconds say what whole seconds cannot.
			default:
				fields = append(fields, api.FieldError{Location: loc,
					Message: fmt.Sprintf("in the specification's form this is %s", n.seed)})
			}
		}
	}
	native := schemas.Manifest().Properties
	for _, k := range slices.Sorted(maps.Keys(top)) {
		if slices.Contains(seedTop, k) || slices.ContainsFunc(fields, func(f api.FieldError) bool { return strings.HasPrefix(f.Location+"/", "/"+k+"/") }) {
			continue
		}
		loc := "/" + jsonPointerToken(k)
		if _, ok := native[k]; ok {
			fields = append(fields, api.FieldError{Location: loc,
				Message: fmt.Sprintf("a member of toolgate's form: in the specification's form it goes in /%s", SeedExtension)})
		} else {
			fields = append(fields, api.FieldError{Location: loc, Message: "unknown member"})
		}
	}
	return fields
}

// has reports whether the object obj holds the member at path.
func has(obj map[string]json.RawMessage, path []string) bool {
	raw, ok := obj[path[0]]
	if !ok || len(path) == 1 {
		return ok
	}
	var inner map[string]json.RawMessage
	return json.Unmarshal(raw, &inner) == nil && has(inner, path[1:])
}

func jsonPointerToken(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// relocate rewrites err's field locations, which point into the converted
// document, to the members of the specification's form they came from.
func relocate(err error, origin map[string]string) {
	e := api.AsError(err)
	for i, f := range e.Fields {
		e.Fields[i].Location = memberLocation(api.FieldError{Location: seedLocation(f.Location, origin), Message: f.Message})
	}
}

// memberLocation is the location of f, made the unknown member's own path
// when f refuses one member its object does not allow.
func memberLocation(f api.FieldError) string {
	name, ok := strings.CutPrefix(f.Message, "additionalProperties '")
	if !ok {
		return f.Location
	}
	if name, ok = strings.CutSuffix(name, "' not allowed"); !ok || strings.Contains(name, "'") {
		return f.Location
	}
	return strings.TrimSuffix(f.Location, "/") + "/" + jsonPointerToken(name)
}

func seedLocation(loc string, origin map[string]string) string {
	for native, seed := range origin {
		if loc == native || strings.HasPrefix(loc, native+"/") {
			return seed + strings.TrimPrefix(loc, native)
		}
	}
	// A member the document lacks has its place all the same.
	for _, n := range seedNames {
		native := "/" + strings.Join(n.native, "/")
		if n.seed != "/execution_config/default_timeout_seconds" && (loc == native || strings.HasPrefix(loc, native+"/")) {
			return n.seed + strings.TrimPrefix(loc, native)
		}
	}
	if loc == "/" || loc == "" {
		return "/" + SeedExtension
	}
	return "/" + SeedExtension + loc
}

// SeedForm writes a manifest in toolgate's form (doc, as the registry keeps
// it) in the specification's form: the members the specification names
// under its names, the rest in x-toolgate. A timeout that is not whole
// seconds stays limits.timeout_ms in x-toolgate. Parse reads the result
// back as the same manifest.
func SeedForm(doc []byte) ([]byte, error) {
	native, err := Native(doc)
	if err != nil {
		return nil, err
	}
	if _, err := Parse(native); err != nil {
		return nil, err
	}
	var rest map[string]json.RawMessage
	if err := json.Unmarshal(native, &rest); err != nil {
		return nil, err
	}
	take := func(k string) json.RawMessage {
		v := rest[k]
		delete(rest, k)
		return v
	}
	str := func(k string) string {
		var s string
		_ = json.Unmarshal(take(k), &s) // a string: Parse accepted it
		return s
	}
	s := seedManifest{
		ToolID: str("id"), ToolName: str("name"), Description: str("description"),
		Category: str("category"), Version: str("version"),
		ParametersSchema: take("input_schema"), ResultSchema: take("output_schema"),
		Permissions: take("permissions"),
	}
	var e seedExecutionConfig
	limits := member(rest, "limits")
	if ms, ok := intMember(limits, "timeout_ms"); ok && ms%1000 == 0 {
		e.DefaultTimeoutSeconds = ptr(ms / 1000)
		delete(limits, "timeout_ms")
	}
	if v, ok := intMember(limits, "cpu_millicores"); ok {
		e.DefaultCPUMillicoreLimit = ptr(v)
		delete(limits, "cpu_millicores")
	}
	if v, ok := intMember(limits, "memory_mb"); ok {
		e.DefaultMemoryMBLimit = ptr(v)
		delete(limits, "memory_mb")
	}
	safety := member(rest, "safety")
	if raw, ok := safety["requires_approval"]; ok {
		var b bool
		_ = json.Unmarshal(raw, &b)
		e.RequiresApproval = &b
		delete(safety, "requires_approval")
	}
	putMember(rest, "limits", limits)
	putMember(rest, "safety", safety)
	e.RetryPolicy, e.CircuitBreakerConfig = take("retry_policy"), take("circuit_breaker")
	if e.DefaultTimeoutSeconds != nil || e.DefaultCPUMillicoreLimit != nil || e.DefaultMemoryMBLimit != nil ||
		e.RequiresApproval != nil || e.RetryPolicy != nil || e.CircuitBreakerConfig != nil {
		s.ExecutionConfig = &e
	}
	if len(rest) > 0 {
		s.Extension = rest
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func ptr[T any](v T) *T { return &v }

// member decodes the object member k of obj; nil when it has none.
func member(obj map[string]json.RawMessage, k string) map[string]json.RawMessage {
	var m map[string]json.RawMessage
	_ = json.Unmarshal(obj[k], &m)
	return m
}

// putMember stores m as obj's member k, or removes k when m is empty.
func putMember(obj map[string]json.RawMessage, k string, m map[string]json.RawMessage) {
	if len(m) == 0 {
		delete(obj, k)
		return
	}
	obj[k], _ = json.Marshal(m)
}

func intMember(obj map[string]json.RawMessage, k string) (int64, bool) {
	var v int64
	raw, ok := obj[k]
	return v, ok && json.Unmarshal(raw, &v) == nil
}
