package tools

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/schemas"
)

// manifestJSON returns a valid manifest document with edit applied to its
// map form.
func manifestJSON(t testing.TB, edit func(m map[string]any)) []byte {
	t.Helper()
	m := map[string]any{
		"id":            "calc.add",
		"name":          "Add",
		"version":       "1.0.0",
		"description":   "Adds two integers.",
		"kind":          "builtin",
		"builtin":       map[string]any{"function": "add"},
		"input_schema":  json.RawMessage(`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false}`),
		"output_schema": json.RawMessage(`{"type":"object","properties":{"sum":{"type":"integer"}},"required":["sum"]}`),
	}
	if edit != nil {
		edit(m)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustParse(t testing.TB, doc []byte) *Manifest {
	t.Helper()
	m, err := Parse(doc)
	if err != nil {
		t.Fatalf("Parse: %v (fields %+v)", err, api.AsError(err).Fields)
	}
	return m
}

func hasField(fields []api.FieldError, loc, substr string) bool {
	for _, f := range fields {
		if f.Location == loc && strings.Contains(f.Message, substr) {
			return true
		}
	}
	return false
}

func TestParseDefaults(t *testing.T) {
	m := mustParse(t, manifestJSON(t, nil))
	if m.Safety.RiskLevel != "low" || m.Lifecycle.State != StateActive {
		t.Fatalf("defaults not filled: risk %q, state %q", m.Safety.RiskLevel, m.Lifecycle.State)
	}
	if m.Timeout() != DefaultTimeout {
		t.Fatalf("Timeout() = %v, want %v", m.Timeout(), DefaultTimeout)
	}
	if m.Key() != "calc.add@1.0.0" {
		t.Fatalf("Key() = %q", m.Key())
	}
	if m.Builtin == nil || m.Builtin.Function != "add" {
		t.Fatalf("Builtin = %+v", m.Builtin)
	}
}

// TestKindImpliesNetwork: an http or model tool reaches the network
// whatever its manifest declares, so a token excluding "network" cannot
// call one; other kinds keep what they declare.
func TestKindImpliesNetwork(t *testing.T) {
	cases := []struct {
		kind, spec string
		declared   []string
		want       []string
	}{
		{"http", `{"method":"GET","url":"https://api.example.com/x"}`, nil, []string{"network"}},
		{"http", `{"method":"GET","url":"https://api.example.com/x"}`, []string{"fs.read"}, []string{"fs.read", "network"}},
		{"http", `{"method":"GET","url":"https://api.example.com/x"}`, []string{"network.http"}, []string{"network.http"}},
		{"builtin", `{"function":"add"}`, nil, nil},
	}
	for _, c := range cases {
		doc := manifestJSON(t, func(m map[string]any) {
			delete(m, "builtin")
			m["kind"] = c.kind
			m[c.kind] = json.RawMessage(c.spec)
			if c.declared != nil {
				m["safety"] = map[string]any{"side_effects": c.declared}
			}
		})
		m := mustParse(t, doc)
		if !slices.Equal(m.Safety.SideEffects, c.want) {
			t.Errorf("%s tool declaring %v: side effects %v, want %v", c.kind, c.declared, m.Safety.SideEffects, c.want)
		}
	}
}

func TestParseFull(t *testing.T) {
	m := mustParse(t, manifestJSON(t, func(m map[string]any) {
		m["limits"] = map[string]any{"timeout_ms": 1500, "memory_mb": 64}
		m["safety"] = map[string]any{"risk_level": "high", "side_effects": []string{"network.http"}, "requires_approval": true}
		m["permissions"] = map[string]any{"network": []any{map[string]any{"host": "api.example.com", "port": 443}}}
		m["rate_limit"] = map[string]any{"requests": 5, "per_seconds": 60}
		m["retry_policy"] = map[string]any{"max_attempts": 3}
		m["circuit_breaker"] = map[string]any{"failure_rate_threshold": 50}
		m["cost"] = map[string]any{"per_call": 0.5, "currency": "USD"}
		m["lifecycle"] = map[string]any{"state": "sunset", "sunset_at": "2030-06-01T12:00:00Z"}
	}))
	if m.Timeout() != 1500*time.Millisecond {
		t.Errorf("Timeout() = %v", m.Timeout())
	}
	if m.Safety.RiskLevel != "high" || !m.Safety.RequiresApproval || m.Limits.MemoryMB != 64 {
		t.Errorf("safety/limits not decoded: %+v %+v", m.Safety, m.Limits)
	}
	if m.Permissions.Network[0].Port != 443 || m.RateLimit.PerSeconds != 60 || m.RetryPolicy.MaxAttempts != 3 ||
		m.CircuitBreaker.FailureRateThreshold != 50 || m.Cost.Currency != "USD" {
		t.Errorf("policies not decoded: %+v", m)
	}
	if want := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC); !m.Lifecycle.SunsetAt.Equal(want) || m.Lifecycle.State != StateSunset {
		t.Errorf("lifecycle = %+v", m.Lifecycle)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		doc  []byte
		loc  string // "" when no field error is expected
		msg  string
	}{
		{"not JSON", []byte(`{"id":`), "", "invalid JSON"},
		{"missing input_schema", manifestJSON(t, func(m map[string]any) { delete(m, "input_schema") }), "/", "input_schema"},
		{"bad version", manifestJSON(t, func(m map[string]any) { m["version"] = "v1" }), "/version", "pattern"},
		{"version overflows", manifestJSON(t, func(m map[string]any) { m["version"] = "99999999999999999999.0.0" }), "/version", "range"},
		{"unknown property", manifestJSON(t, func(m map[string]any) { m["owner"] = "me" }), "/", "owner"},
		{"bad kind", manifestJSON(t, func(m map[string]any) { m["kind"] = "lambda" }), "/kind", "one of"},
		{"input schema invalid", manifestJSON(t, func(m map[string]any) {
			m["input_schema"] = json.RawMessage(`{"type":"object","properties":{"a":{"type":"int"}}}`)
		}), "/input_schema/properties/a/type", ""},
		{"output schema remote ref", manifestJSON(t, func(m map[string]any) {
			m["output_schema"] = json.RawMessage(`{"$ref":"https://example.com/out.json"}`)
		}), "/output_schema", "not allowed"},
		{"integer Go cannot hold", manifestJSON(t, func(m map[string]any) {
			m["limits"] = json.RawMessage(`{"memory_mb": 1e30}`)
		}), "", "decoding"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Parse(tt.doc)
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", m)
			}
			if !errors.Is(err, api.ErrInvalidParameters) {
				t.Fatalf("error %v is not invalid_parameters", err)
			}
			te := api.AsError(err)
			if te.ECode != api.EInvalidManifest {
				t.Fatalf("ECode = %s, want %s", te.ECode, api.EInvalidManifest)
			}
			if tt.loc == "" {
				if !strings.Contains(te.Message, tt.msg) {
					t.Fatalf("message %q does not mention %q", te.Message, tt.msg)
				}
				return
			}
			if !hasField(te.Fields, tt.loc, tt.msg) {
				t.Fatalf("want a field error at %q mentioning %q, got %+v", tt.loc, tt.msg, te.Fields)
			}
		})
	}
}

// TestParseRoundTrip checks that a parsed manifest marshals back to a document
// Parse accepts unchanged, which the pipeline relies on when it stores the
// examples.
func TestParseRoundTrip(t *testing.T) {
	ms, err := Examples()
	if err != nil {
		t.Fatal(err)
	}
	ms = append(ms, mustParse(t, manifestJSON(t, func(m map[string]any) {
		m["lifecycle"] = map[string]any{"state": "sunset", "sunset_at": "2030-06-01T12:00:00.5+02:00"}
		m["cost"] = map[string]any{"per_call": 0}
		m["http"] = map[string]any{"url": "https://api.example.com/v1/items/{{id}}"}
	})))
	for _, m := range ms {
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		again := mustParse(t, b)
		if !sameManifest(m, again) {
			t.Errorf("%s changed in a round trip:\n%+v\n%+v", m.Key(), m, again)
		}
	}
}

// sameManifest compares the exported fields, ignoring compiled schemas and
// JSON formatting.
func sameManifest(a, b *Manifest) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	var va, vb any
	_ = json.Unmarshal(ja, &va)
	_ = json.Unmarshal(jb, &vb)
	return reflect.DeepEqual(va, vb)
}

func TestValidateInput(t *testing.T) {
	m := mustParse(t, manifestJSON(t, nil))
	noReq := mustParse(t, manifestJSON(t, func(m map[string]any) { m["input_schema"] = json.RawMessage(`{"type":"object"}`) }))
	tests := []struct {
		name   string
		m      *Manifest
		params string
		loc    string // "" when valid
		msg    string
	}{
		{"valid", m, `{"a":1,"b":2}`, "", ""},
		{"large integer", m, `{"a":123456789012345678901234567890,"b":2}`, "", ""},
		{"missing b", m, `{"a":1}`, "/", "b"},
		{"wrong type", m, `{"a":"1","b":2}`, "/a", "integer"},
		{"fraction", m, `{"a":1.5,"b":2}`, "/a", "integer"},
		{"extra", m, `{"a":1,"b":2,"c":3}`, "/", "c"},
		{"null counts as {}", m, `null`, "/", "missing"},
		{"empty counts as {}", noReq, ``, "", ""},
		{"null with no required fields", noReq, ` null `, "", ""},
		{"array", noReq, `[]`, "/", "expected object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fields, err := tt.m.ValidateInput([]byte(tt.params))
			if err != nil {
				t.Fatal(err)
			}
			if tt.loc == "" {
				if fields != nil {
					t.Fatalf("rejected: %+v", fields)
				}
				return
			}
			if !hasField(fields, tt.loc, tt.msg) {
				t.Fatalf("want a field error at %q mentioning %q, got %+v", tt.loc, tt.msg, fields)
			}
		})
	}
	if _, err := m.ValidateInput([]byte(`{"a":`)); err == nil {
		t.Error("undecodable parameters gave no error")
	}
}

func TestValidateOutput(t *testing.T) {
	m := mustParse(t, manifestJSON(t, nil))
	if fields, err := m.ValidateOutput([]byte(`{"sum":3}`)); err != nil || fields != nil {
		t.Fatalf("valid output: %v %v", fields, err)
	}
	fields, err := m.ValidateOutput([]byte(`{"sum":"3"}`))
	if err != nil || !hasField(fields, "/sum", "integer") {
		t.Fatalf("bad output: fields %+v, err %v", fields, err)
	}
	if fields, _ := m.ValidateOutput([]byte(`{}`)); !hasField(fields, "/", "sum") {
		t.Fatalf("missing sum: %+v", fields)
	}
	if _, err := m.ValidateOutput([]byte(`not json`)); err == nil {
		t.Fatal("non-JSON output gave no error")
	}

	none := mustParse(t, manifestJSON(t, func(m map[string]any) { delete(m, "output_schema") }))
	if fields, err := none.ValidateOutput([]byte(`anything`)); err != nil || fields != nil {
		t.Fatalf("no output schema: %v %v", fields, err)
	}
}

func TestExamples(t *testing.T) {
	ms, err := Examples()
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]*Manifest{}
	for _, m := range ms {
		byKey[m.Key()] = m
		if m.Kind == "builtin" && m.Builtin == nil || !slices.Contains([]string{"builtin", "http", "cli"}, m.Kind) {
			t.Errorf("%s is not a builtin, http or cli tool", m.Key())
		}
		if m.output == nil {
			t.Errorf("%s has no output schema", m.Key())
		}
	}
	want := map[string]struct {
		function string
		timeout  time.Duration
		state    string
	}{
		"echo@1.0.0":            {"echo", 5 * time.Second, StateDeprecated},
		"echo@2.0.0":            {"echo", 5 * time.Second, StateActive},
		"noop@1.0.0":            {"noop", time.Second, StateActive},
		"sleep@1.0.0":           {"sleep", 10 * time.Second, StateActive},
		"json.transform@1.0.0":  {"json_transform", 5 * time.Second, StateActive},
		"fs.read_file@1.0.0":    {"read_file", 5 * time.Second, StateActive},
		"fs.write_file@1.0.0":   {"write_file", 5 * time.Second, StateActive},
		"fs.append_file@1.0.0":  {"append_file", 5 * time.Second, StateActive},
		"fs.list_dir@1.0.0":     {"list_dir", 5 * time.Second, StateActive},
		"fs.stat@1.0.0":         {"stat", 5 * time.Second, StateActive},
		"parse.json@1.0.0":      {"parse_json", 5 * time.Second, StateActive},
		"parse.yaml@1.0.0":      {"parse_yaml", 5 * time.Second, StateActive},
		"math.eval@1.0.0":       {"math_eval", 5 * time.Second, StateActive},
		"http.get@1.0.0":        {"", 10 * time.Second, StateActive},
		"text.word_count@1.0.0": {"", 5 * time.Second, StateActive},
	}
	if len(ms) != len(want) {
		t.Errorf("got %d examples, want %d", len(ms), len(want))
	}
	for key, w := range want {
		m := byKey[key]
		if m == nil {
			t.Errorf("example %s missing", key)
			continue
		}
		fn := ""
		if m.Builtin != nil {
			fn = m.Builtin.Function
		}
		if fn != w.function || m.Timeout() != w.timeout || m.Lifecycle.State != w.state {
			t.Errorf("%s: function %q timeout %v state %q, want %+v", key, fn, m.Timeout(), m.Lifecycle.State, w)
		}
		// The example documents must satisfy the schema on their own.
		doc, _ := exampleFS.ReadFile("examples/" + key[:strings.IndexByte(key, '@')] + "-" + m.Version + ".json")
		if fields, err := schemas.Validate(schemas.Manifest(), doc); err != nil || fields != nil {
			t.Errorf("%s: schema: %v %v", key, fields, err)
		}
	}
	if byKey["echo@1.0.0"].Lifecycle.DeprecatedInFavorOf != "2.0.0" {
		t.Error("echo 1.0.0 does not point to 2.0.0")
	}
	if fs := byKey["fs.read_file@1.0.0"]; fs.Category != "file_system" || !reflect.DeepEqual(fs.Safety.SideEffects, []string{"fs.read"}) ||
		len(fs.Permissions.Filesystem) != 1 || fs.Permissions.Filesystem[0] != (FilesystemPermission{Path: ".", Mode: "ro"}) {
		t.Errorf("fs.read_file safety or permissions wrong: %+v %+v", fs.Safety, fs.Permissions)
	}
}

// TestExampleContracts runs each example's schemas against the parameters and
// results the builtins take and give.
func TestExampleContracts(t *testing.T) {
	ms, err := Examples()
	if err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry()
	for _, m := range ms {
		reg.Put(m)
	}
	tests := []struct {
		tool, version string
		in, out       string
		inOK, outOK   bool
	}{
		{"echo", "1.0.0", `{"message":"hi","extra":1}`, `{"message":"hi","extra":1}`, true, true},
		{"echo", "2.0.0", `{"message":"hi"}`, `{"message":"hi"}`, true, true},
		{"echo", "2.0.0", `{}`, `{}`, false, false},
		{"echo", "2.0.0", `{"message":"` + strings.Repeat("x", 4097) + `"}`, `{"message":"x"}`, false, true},
		{"noop", "1.0.0", `null`, `{}`, true, true},
		{"noop", "1.0.0", `{"anything":[1,2]}`, `{"x":1}`, true, false},
		{"sleep", "1.0.0", `{"ms":250}`, `{"slept_ms":250}`, true, true},
		{"sleep", "1.0.0", `{"ms":600001}`, `{"slept":1}`, false, false},
		{"sleep", "1.0.0", `{"ms":-1}`, `{"slept_ms":1.5}`, false, false},
		{"json.transform", "1.0.0", `{"data":{"a":[3,1]},"pointer":"/a","op":"sort"}`, `{"result":[1,3]}`, true, true},
		{"json.transform", "1.0.0", `{"data":null,"pick":["a"],"op":"keys"}`, `{"result":null}`, true, true},
		{"json.transform", "1.0.0", `{"data":1,"pointer":"a"}`, `{"value":1}`, false, false},
		{"json.transform", "1.0.0", `{"data":1,"pointer":"/a~2"}`, `{}`, false, false},
		{"json.transform", "1.0.0", `{"data":1,"op":"reverse"}`, `[]`, false, false},
		{"fs.read_file", "1.0.0", `{"path":"notes.txt","max_bytes":100}`, `{"path":"notes.txt","content":"hi","size":2,"truncated":false}`, true, true},
		{"fs.read_file", "1.0.0", `{"path":"notes.txt","max_bytes":0}`, `{"path":"notes.txt","content":"hi","size":2}`, false, false},
		{"fs.read_file", "1.0.0", `{"max_bytes":10}`, `{"path":"a","content":"","size":-1,"truncated":false}`, false, false},
	}
	for _, tt := range tests {
		m, err := reg.Resolve(tt.tool, tt.version)
		if err != nil {
			t.Fatal(err)
		}
		fields, err := m.ValidateInput([]byte(tt.in))
		if err != nil || (fields == nil) != tt.inOK {
			t.Errorf("%s input %s: fields %+v, err %v, want ok = %v", m.Key(), tt.in, fields, err, tt.inOK)
		}
		fields, err = m.ValidateOutput([]byte(tt.out))
		if err != nil || (fields == nil) != tt.outOK {
			t.Errorf("%s output %s: fields %+v, err %v, want ok = %v", m.Key(), tt.out, fields, err, tt.outOK)
		}
	}
}

// TestManifestHooks: a manifest's hooks are compiled at registration; one
// whose condition does not compile is refused with E3800 and its position.
func TestManifestHooks(t *testing.T) {
	base := `{"id":"h","name":"h","version":"1.0.0","description":"d","kind":"builtin","builtin":{"function":"echo"},
	  "input_schema":{"type":"object"},"hooks":[%s]}`
	m, err := Parse([]byte(fmt.Sprintf(base, `{"on":"timeout","action":"retry","max_attempts":2}`)))
	if err != nil {
		t.Fatal(err)
	}
	if s := m.HookSet(); s == nil || len(s.Specs) != 1 || s.Specs[0].Name != "timeout-0" {
		t.Fatalf("hooks: %+v", s)
	}
	_, err = Parse([]byte(fmt.Sprintf(base, `{"on":"custom","action":"fail","condition":"status = 'x'"}`)))
	var te *api.Error
	if !errors.As(err, &te) || te.ECode != api.EHookInvalid || len(te.Fields) == 0 ||
		te.Fields[0].Location != "/hooks/0/condition" || !strings.Contains(te.Fields[0].Message, "line 1, column") {
		t.Fatalf("got %v %+v, want E3800 at /hooks/0/condition with a position", err, te)
	}
}

// TestParseDiscoveryMetadata: the seed's examples, dependencies, author and
// documentation metadata and lifecycle dates are kept, and malformed ones
// refused.
func TestParseDiscoveryMetadata(t *testing.T) {
	m := mustParse(t, manifestJSON(t, func(m map[string]any) {
		m["capabilities"] = []string{"add", "arithmetic"}
		m["examples"] = []any{map[string]any{"description": "two and two", "input": map[string]any{"a": 2, "b": 2}, "expected_output": map[string]any{"sum": 4}}}
		m["dependencies"] = map[string]any{"required_tools": []string{"echo"}, "os": []string{"linux"}}
		m["metadata"] = map[string]any{"author": "Ada", "documentation_url": "https://example.com/add", "license": "MIT"}
		m["lifecycle"] = map[string]any{"deprecation_date": "2031-01-01T00:00:00Z", "created_at": "2030-01-01T00:00:00Z",
			"updated_at": "2030-02-01T00:00:00Z", "release_notes": "first"}
	}))
	if !slices.Equal(m.Capabilities, []string{"add", "arithmetic"}) || len(m.Examples) != 1 || string(m.Examples[0].ExpectedOutput) != `{"sum":4}` {
		t.Errorf("capabilities/examples = %v %+v", m.Capabilities, m.Examples)
	}
	if m.Dependencies.RequiredTools[0] != "echo" || m.Metadata.Author != "Ada" || m.Metadata.License != "MIT" {
		t.Errorf("dependencies/metadata = %+v %+v", m.Dependencies, m.Metadata)
	}
	l := m.Lifecycle
	if l.ReleaseNotes != "first" || l.CreatedAt.Year() != 2030 || l.UpdatedAt.Month() != 2 || l.DeprecationDate.Year() != 2031 {
		t.Errorf("lifecycle = %+v", l)
	}
	for name, edit := range map[string]func(map[string]any){
		"example without input":  func(m map[string]any) { m["examples"] = []any{map[string]any{"description": "x"}} },
		"unknown metadata field": func(m map[string]any) { m["metadata"] = map[string]any{"owner": "x"} },
		"capability with spaces": func(m map[string]any) { m["capabilities"] = []string{"read file"} },
		"bad deprecation date":   func(m map[string]any) { m["lifecycle"] = map[string]any{"deprecation_date": "tomorrow"} },
	} {
		if _, err := Parse(manifestJSON(t, edit)); !errors.Is(err, api.ErrInvalidParameters) {
			t.Errorf("%s: Parse error %v, want invalid_parameters", name, err)
		}
	}
}

// TestManifestJSONKeepsItsKindsMember: a manifest's kind configuration is
// encoded where its own member stood, after kind and before input_schema,
// escaped as the caller's encoder escapes, and decodes back as the kind's
// configuration.
func TestManifestJSONKeepsItsKindsMember(t *testing.T) {
	m, err := Parse([]byte(`{"id":"get","name":"get","version":"1.0.0","description":"a <b> & c","kind":"http",
		"http":{"url":"https://x.example/<p>", "method":"GET"},"input_schema":{"type":"object"}}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"get","name":"get","version":"1.0.0","description":"a \u003cb\u003e \u0026 c","kind":"http",` +
		`"http":{"url":"https://x.example/\u003cp\u003e","method":"GET"},"input_schema":{"type":"object"},`
	if !strings.HasPrefix(string(b), want) {
		t.Fatalf("got  %s\nwant %s…", b, want)
	}
	var raw bytes.Buffer
	enc := json.NewEncoder(&raw)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(*m); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(raw.String(), `"description":"a <b> & c","kind":"http","http":{"url":"https://x.example/<p>","method":"GET"}`) {
		t.Fatalf("unescaped: %s", raw.String())
	}
	back, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if string(back.Spec()) != `{"url":"https://x.example/\u003cp\u003e","method":"GET"}` {
		t.Fatalf("decoded configuration %s", back.Spec())
	}
	// A builtin's configuration is its typed member, encoded once.
	e, err := Parse([]byte(`{"id":"e","name":"e","version":"1.0.0","description":"e","kind":"builtin",
		"builtin":{"function":"echo"},"input_schema":{"type":"object"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(e); strings.Count(string(b), `"builtin"`) != 2 || !strings.Contains(string(b), `"kind":"builtin","builtin":{"function":"echo"},"input_schema"`) {
		t.Fatalf("builtin: %s", b)
	}
}
