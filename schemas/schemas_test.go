package schemas

import (
	"encoding/json"
	"fmt"
	"github.com/toolgate/toolgate/api"
	"reflect"
	"strings"
	"testing"
)

// validManifest is the smallest manifest the schema accepts, as a map so each
// case can change one thing.
func validManifest() map[string]any {
	return map[string]any{
		"id":           "fs.read_file",
		"name":         "Read file",
		"version":      "1.2.3-rc.1",
		"description":  "Reads a file.",
		"kind":         "builtin",
		"builtin":      map[string]any{"function": "read_file"},
		"input_schema": map[string]any{"type": "object"},
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// hasField reports whether fields has an error at loc whose message contains
// substr.
func hasField(fields []api.FieldError, loc, substr string) bool {
	for _, f := range fields {
		if f.Location == loc && strings.Contains(f.Message, substr) {
			return true
		}
	}
	return false
}

func TestManifestSchema(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(m map[string]any)
		loc    string // "" when the manifest must be valid
		substr string
	}{
		{name: "minimal", edit: func(map[string]any) {}},
		{name: "full", edit: func(m map[string]any) {
			m["category"] = "file_system"
			m["tags"] = []string{"fs", "read"}
			m["output_schema"] = map[string]any{"type": "object"}
			m["safety"] = map[string]any{"risk_level": "medium", "side_effects": []string{"fs.read"}, "requires_approval": false, "reversible": true, "idempotent": true}
			m["limits"] = map[string]any{"timeout_ms": 5000, "cpu_millicores": 500, "memory_mb": 64, "pids": 8, "output_bytes": 1 << 20}
			m["permissions"] = map[string]any{
				"filesystem":  []any{map[string]any{"path": ".", "mode": "ro"}},
				"network":     []any{map[string]any{"host": "example.com", "port": 443}},
				"credentials": []string{"github"},
			}
			m["rate_limit"] = map[string]any{"requests": 10, "per_seconds": 1, "burst": 0}
			m["retry_policy"] = map[string]any{"max_attempts": 3, "base_delay_ms": 100, "max_delay_ms": 1000, "retryable_errors": []string{"timeout"}}
			m["circuit_breaker"] = map[string]any{"failure_rate_threshold": 50.5, "sliding_window_size": 20, "minimum_calls": 5, "wait_duration_seconds": 30, "half_open_calls": 2, "slow_call_ms": 2000}
			m["cost"] = map[string]any{"per_call": 0.001, "currency": "USD", "typical_latency_ms": 20}
			m["lifecycle"] = map[string]any{"state": "deprecated", "deprecated_in_favor_of": "2.0.0", "sunset_at": "2030-01-01T00:00:00Z"}
		}},
		{name: "namespaced id", edit: func(m map[string]any) { m["id"] = "mcp:fs:read_file" }},
		{name: "http kind needs no builtin", edit: func(m map[string]any) {
			delete(m, "builtin")
			m["kind"] = "http"
			m["http"] = map[string]any{"url": "https://example.com"}
		}},
		{name: "missing input_schema", edit: func(m map[string]any) { delete(m, "input_schema") }, loc: "/", substr: "input_schema"},
		{name: "bad version", edit: func(m map[string]any) { m["version"] = "1.0" }, loc: "/version", substr: "pattern"},
		{name: "version with build metadata", edit: func(m map[string]any) { m["version"] = "1.0.0+build.5" }, loc: "/version", substr: "pattern"},
		{name: "version with leading zero", edit: func(m map[string]any) { m["version"] = "01.0.0" }, loc: "/version", substr: "pattern"},
		{name: "unknown property", edit: func(m map[string]any) { m["colour"] = "red" }, loc: "/", substr: "colour"},
		{name: "bad kind", edit: func(m map[string]any) { m["kind"] = "grpc" }, loc: "/kind", substr: "one of"},
		{name: "upper-case id", edit: func(m map[string]any) { m["id"] = "Echo" }, loc: "/id", substr: "pattern"},
		{name: "builtin kind without builtin", edit: func(m map[string]any) { delete(m, "builtin") }, loc: "/", substr: "builtin"},
		{name: "input_schema not an object", edit: func(m map[string]any) { m["input_schema"] = true }, loc: "/input_schema", substr: "expected object"},
		{name: "duplicate tags", edit: func(m map[string]any) { m["tags"] = []string{"a", "a"} }, loc: "/tags", substr: "equal"},
		{name: "bad risk level", edit: func(m map[string]any) { m["safety"] = map[string]any{"risk_level": "extreme"} }, loc: "/safety/risk_level", substr: "one of"},
		{name: "timeout too long", edit: func(m map[string]any) { m["limits"] = map[string]any{"timeout_ms": 3600001} }, loc: "/limits/timeout_ms", substr: "<="},
		{name: "fractional timeout", edit: func(m map[string]any) { m["limits"] = map[string]any{"timeout_ms": 1.5} }, loc: "/limits/timeout_ms", substr: "integer"},
		{name: "bad fs mode", edit: func(m map[string]any) {
			m["permissions"] = map[string]any{"filesystem": []any{map[string]any{"path": "/tmp", "mode": "wx"}}}
		}, loc: "/permissions/filesystem/0/mode", substr: "one of"},
		{name: "too many attempts", edit: func(m map[string]any) { m["retry_policy"] = map[string]any{"max_attempts": 11} }, loc: "/retry_policy/max_attempts", substr: "<="},
		{name: "failure rate over 100", edit: func(m map[string]any) { m["circuit_breaker"] = map[string]any{"failure_rate_threshold": 101} }, loc: "/circuit_breaker/failure_rate_threshold", substr: "<="},
		{name: "negative cost", edit: func(m map[string]any) { m["cost"] = map[string]any{"per_call": -1} }, loc: "/cost/per_call", substr: ">="},
		{name: "bad lifecycle state", edit: func(m map[string]any) { m["lifecycle"] = map[string]any{"state": "retired"} }, loc: "/lifecycle/state", substr: "one of"},
		{name: "bad sunset_at", edit: func(m map[string]any) { m["lifecycle"] = map[string]any{"sunset_at": "next tuesday"} }, loc: "/lifecycle/sunset_at", substr: "date-time"},
		{name: "unknown safety field", edit: func(m map[string]any) { m["safety"] = map[string]any{"dangerous": true} }, loc: "/safety", substr: "dangerous"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := validManifest()
			tt.edit(m)
			fields, err := Validate(Manifest(), mustJSON(t, m))
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if tt.loc == "" {
				if fields != nil {
					t.Fatalf("valid manifest rejected: %+v", fields)
				}
				return
			}
			if !hasField(fields, tt.loc, tt.substr) {
				t.Fatalf("want a field error at %q mentioning %q, got %+v", tt.loc, tt.substr, fields)
			}
		})
	}
}

func validRequest() map[string]any {
	return map[string]any{
		"tool_id":       "echo",
		"agent_context": map[string]any{"agent_did": "did:example:agent", "tenant_id": "acme_1"},
	}
}

func TestInvokeRequestSchema(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(r map[string]any)
		loc    string
		substr string
	}{
		{name: "minimal", edit: func(map[string]any) {}},
		{name: "full", edit: func(r map[string]any) {
			r["tool_version"] = "^1.2"
			r["invocation_id"] = "inv-1"
			r["parameters"] = map[string]any{"message": "hi"}
			r["agent_context"] = map[string]any{"agent_did": "did:a", "tenant_id": "t", "session_id": "s", "user_did": "did:u"}
			r["capability_token"] = "tok"
			r["resource_limits"] = map[string]any{"cpu_millicore_limit": 100, "memory_mb_limit": 64, "timeout_seconds": 5, "network_bandwidth_mbps": 1}
			r["execution_options"] = map[string]any{"async_mode": true, "priority": "high", "idempotency_key": "k", "require_approval": false}
			r["checkpoint_config"] = map[string]any{"enable_checkpointing": true, "checkpoint_interval_seconds": 10, "resume_from_checkpoint_id": "c"}
			r["document_context"] = map[string]any{"document_refs": []string{"doc:1"}, "version_pinning": true, "query": "q"}
		}},
		{name: "unknown top-level field", edit: func(r map[string]any) { r["tool"] = "echo" }, loc: "/", substr: "tool"},
		{name: "unknown agent_context field", edit: func(r map[string]any) {
			r["agent_context"] = map[string]any{"agent_did": "a", "tenant_id": "t", "role": "admin"}
		}, loc: "/agent_context", substr: "role"},
		{name: "unknown execution option", edit: func(r map[string]any) { r["execution_options"] = map[string]any{"fast": true} }, loc: "/execution_options", substr: "fast"},
		{name: "bad tenant id", edit: func(r map[string]any) {
			r["agent_context"] = map[string]any{"agent_did": "a", "tenant_id": "acme/../other"}
		}, loc: "/agent_context/tenant_id", substr: "pattern"},
		{name: "tenant id too long", edit: func(r map[string]any) {
			r["agent_context"] = map[string]any{"agent_did": "a", "tenant_id": strings.Repeat("a", 65)}
		}, loc: "/agent_context/tenant_id", substr: "pattern"},
		{name: "missing agent_context", edit: func(r map[string]any) { delete(r, "agent_context") }, loc: "/", substr: "agent_context"},
		{name: "missing agent_did", edit: func(r map[string]any) { r["agent_context"] = map[string]any{"tenant_id": "t"} }, loc: "/agent_context", substr: "agent_did"},
		{name: "empty tool_id", edit: func(r map[string]any) { r["tool_id"] = "" }, loc: "/tool_id", substr: "length"},
		{name: "parameters not an object", edit: func(r map[string]any) { r["parameters"] = []int{1} }, loc: "/parameters", substr: "expected object"},
		{name: "bad priority", edit: func(r map[string]any) { r["execution_options"] = map[string]any{"priority": "urgent"} }, loc: "/execution_options/priority", substr: "one of"},
		{name: "zero timeout", edit: func(r map[string]any) { r["resource_limits"] = map[string]any{"timeout_seconds": 0} }, loc: "/resource_limits/timeout_seconds", substr: ">="},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := validRequest()
			tt.edit(r)
			fields, err := Validate(InvokeRequest(), mustJSON(t, r))
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if tt.loc == "" {
				if fields != nil {
					t.Fatalf("valid request rejected: %+v", fields)
				}
				return
			}
			if !hasField(fields, tt.loc, tt.substr) {
				t.Fatalf("want a field error at %q mentioning %q, got %+v", tt.loc, tt.substr, fields)
			}
		})
	}
}

func TestValidateUndecodable(t *testing.T) {
	for _, doc := range []string{"", "{", `{"a":1} {}`, "nul"} {
		if _, err := Validate(InvokeRequest(), []byte(doc)); err == nil {
			t.Errorf("Validate(%q) returned no error", doc)
		}
	}
}

func TestValidateKeepsLargeIntegers(t *testing.T) {
	s, err := Compile("big", []byte(`{"type":"integer","maximum":9007199254740993}`))
	if err != nil {
		t.Fatal(err)
	}
	// 2^53+1 fits the maximum exactly; 2^53+2 exceeds it by one, which a
	// float64 decode could not tell apart.
	if fields, err := Validate(s, []byte("9007199254740993")); err != nil || fields != nil {
		t.Fatalf("2^53+1: fields %v, err %v", fields, err)
	}
	if fields, _ := Validate(s, []byte("9007199254740994")); fields == nil {
		t.Fatal("2^53+2 accepted")
	}
}

func TestCompile(t *testing.T) {
	tests := []struct {
		name   string
		schema string
		ok     bool
	}{
		{"object", `{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}`, true},
		{"boolean schema", `true`, true},
		{"local ref", `{"$defs":{"s":{"type":"string"}},"properties":{"a":{"$ref":"#/$defs/s"}}}`, true},
		{"draft-07", `{"$schema":"http://json-schema.org/draft-07/schema#","items":[{"type":"string"}]}`, true},
		{"not JSON", `{"type":`, false},
		{"bad type", `{"type":"text"}`, false},
		{"negative minLength", `{"minLength":-1}`, false},
		{"remote ref", `{"$ref":"https://example.com/schema.json"}`, false},
		{"relative ref", `{"$ref":"other.json"}`, false},
		{"file ref", `{"$ref":"file:///etc/passwd"}`, false},
		{"unknown meta-schema", `{"$schema":"https://example.com/meta"}`, false},
		{"missing local ref", `{"$ref":"#/$defs/none"}`, false},
		// The library's compiler recursed until the stack overflowed (a
		// fatal error, not a panic) on an id naming the schema itself with
		// an empty query.
		{"id with an empty query", `{"$id":"?"}`, false},
		{"own name with an empty query", `{"$id":"own-name-with-an-empty-query?#","type":"object"}`, false},
		{"draft-04 id with an empty query", `{"$schema":"http://json-schema.org/draft-04/schema#","id":"?"}`, false},
		{"id with a query", `{"$id":"a?b"}`, true},
		{"inner id with an empty query", `{"$defs":{"a":{"$id":"?"}}}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Compile("test/"+strings.ReplaceAll(tt.name, " ", "-"), []byte(tt.schema))
			if (err == nil) != tt.ok {
				t.Fatalf("Compile(%s): err = %v, want ok = %v", tt.schema, err, tt.ok)
			}
		})
	}
}

func TestCompileErrorHasFields(t *testing.T) {
	_, err := Compile("x", []byte(`{"properties":{"a":{"minLength":-1}}}`))
	if err == nil {
		t.Fatal("no error")
	}
	if f := Fields(err); !hasField(f, "/properties/a/minLength", ">=") {
		t.Fatalf("Fields = %+v, want one at /properties/a/minLength", f)
	}
}

func TestCompileAssertsFormat(t *testing.T) {
	s, err := Compile("fmt", []byte(`{"type":"string","format":"date-time"}`))
	if err != nil {
		t.Fatal(err)
	}
	if fields, _ := Validate(s, []byte(`"yesterday"`)); fields == nil {
		t.Fatal("format not asserted")
	}
}

func TestFieldsBounded(t *testing.T) {
	props := map[string]any{}
	doc := map[string]any{}
	for i := range 2 * MaxFieldErrors {
		k := fmt.Sprintf("p%03d", i)
		props[k] = map[string]any{"type": "string"}
		doc[k] = i
	}
	s, err := Compile("many", mustJSON(t, map[string]any{"properties": props}))
	if err != nil {
		t.Fatal(err)
	}
	fields, err := Validate(s, mustJSON(t, doc))
	if err != nil {
		t.Fatal(err)
	}
	if len(fields) != MaxFieldErrors {
		t.Fatalf("got %d field errors, want %d", len(fields), MaxFieldErrors)
	}
	seen := map[api.FieldError]bool{}
	for _, f := range fields {
		if seen[f] || f.Message == "" || strings.HasPrefix(f.Message, "doesn't validate") {
			t.Fatalf("duplicate or wrapper entry %+v", f)
		}
		seen[f] = true
	}
}

func TestFieldsOfOtherErrors(t *testing.T) {
	if f := Fields(fmt.Errorf("plain")); f != nil {
		t.Fatalf("Fields(plain error) = %v", f)
	}
	if f := Fields(nil); f != nil {
		t.Fatalf("Fields(nil) = %v", f)
	}
}

// FuzzCompile feeds arbitrary schemas and documents to Compile and Validate,
// which see user data when tools are registered and invoked; Validate
// answers as the library alone does.
func FuzzCompile(f *testing.F) {
	f.Add([]byte(`{"type":"object","properties":{"a":{"type":"integer","maximum":3}},"required":["a"]}`), []byte(`{"a":4}`))
	f.Add([]byte(`{"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}`), []byte(`1`))
	f.Add([]byte(`{"$dynamicAnchor":"x","items":{"$dynamicRef":"#x"}}`), []byte(`[[1]]`))
	f.Add([]byte(`{"$schema":"http://json-schema.org/draft-04/schema#","id":"#a","allOf":[{"$ref":"#a"}]}`), []byte(`{}`))
	f.Add([]byte(`{"$id":"https://x.test/","$ref":"y.json"}`), []byte(`null`))
	f.Add([]byte(`{"$id":"?"}`), []byte(`0`))
	f.Fuzz(func(t *testing.T, schema, doc []byte) {
		s, err := Compile("fuzz", schema)
		if err != nil {
			return
		}
		agree(t, s, doc)
	})
}

func TestMCPContent(t *testing.T) {
	s, err := Compile("mcp-content", MCPContent())
	if err != nil {
		t.Fatal(err)
	}
	for doc, ok := range map[string]bool{
		`{"content":[{"type":"text","text":"hi"}]}`: true,
		`{"content":[]}`:                   true,
		`{}`:                               false,
		`{"content":[{"text":"no type"}]}`: false,
		`{"content":"text"}`:               false,
	} {
		fields, err := Validate(s, []byte(doc))
		if (err == nil && len(fields) == 0) != ok {
			t.Errorf("%s: fields %v, err %v, want valid=%v", doc, fields, err, ok)
		}
	}
}

// decode reads every document as encoding/json alone does: the same value,
// json.Number for numbers, or an error where it errs.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{`{"a":1}`, ` {"a" : [1, 2.5e3, -0, 123456789012345678901234567890]} `, `"\u00e9\ud800"`,
		`{"a":1,"a":2}`, `[{"x":null,"y":true,"z":"<&>"}]`, `{"a":1} x`, `{"a":1}{}`, `[1,]`, "\"\xff\"", `{"\u0000":"\t"}`,
		`1e400`, `[[[[[]]]]]`, "{}\n\t "} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		want, werr := decodeStd(doc)
		got, gerr := decode(doc)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%q: error %v, encoding/json's %v", doc, gerr, werr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: read as %#v, encoding/json reads %#v", doc, got, want)
		}
	})
}
