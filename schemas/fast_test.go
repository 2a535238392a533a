package schemas

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v5"
	"github.com/toolgate/toolgate/api"
)

// libraryValidate is Validate by the library alone, as it was before vouch.
func libraryValidate(s *jsonschema.Schema, doc []byte) ([]api.FieldError, error) {
	return byLibrary(s, doc, decodeStd)
}

// agree fails t unless Validate answers doc exactly as the library alone
// does, and reports whether vouch took the document.
func agree(t *testing.T, s *jsonschema.Schema, doc []byte) (vouched bool) {
	t.Helper()
	want, werr := libraryValidate(s, doc)
	got, gerr := Validate(s, doc)
	// The library visits properties in map order, so its errors, and the
	// names within one, come in any order: compare where they are.
	if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() || !reflect.DeepEqual(places(got), places(want)) {
		t.Fatalf("%s:\nValidate: %v %v\nlibrary:  %v %v", doc, got, gerr, want, werr)
	}
	if json.Valid(doc) {
		// The scan ValidateJSON leaves out was made: it answers the same.
		got, gerr := ValidateJSON(s, doc)
		if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() || !reflect.DeepEqual(places(got), places(want)) {
			t.Fatalf("%s:\nValidateJSON: %v %v\nlibrary:  %v %v", doc, got, gerr, want, werr)
		}
	}
	if wellFormed(doc) && vouchJSON(s, doc) {
		if want != nil || werr != nil {
			t.Fatalf("%s: vouched for, the library finds %v %v", doc, want, werr)
		}
		return true
	}
	return false
}

func places(fields []api.FieldError) []string {
	var out []string
	for _, f := range fields {
		out = append(out, f.Location)
	}
	slices.Sort(out)
	return out
}

// requestValues are values of every kind, and strings and numbers near the
// request schema's bounds, to put anywhere in a request.
var requestValues = []any{
	nil, true, false, "", "x", "acme", "acme_1-B", "acm e", "ünïcode", strings.Repeat("é", 64), strings.Repeat("é", 65),
	strings.Repeat("a", 256), strings.Repeat("a", 257), strings.Repeat("é", 256), strings.Repeat("é", 257), strings.Repeat("a", 129),
	json.Number("0"), json.Number("1"), json.Number("-1"), json.Number("16"), json.Number("17"), json.Number("1.0"),
	json.Number("1e2"), json.Number("2.5"), json.Number("-0"), json.Number("99999999999999999999999"),
	"low", "normal", "high", "retry", "retry_with_fallback", "urgent",
	map[string]any{}, map[string]any{"a": 1}, []any{}, []any{"doc-1"}, []any{""}, []any{1},
}

// requestKeys are the request schema's properties, nested ones by path,
// and a few it does not know.
var requestKeys = [][]string{
	{"tool_id"}, {"tool_version"}, {"invocation_id"}, {"parameters"}, {"capability_token"}, {"unknown"}, {"TOOL_ID"},
	{"agent_context"}, {"agent_context", "agent_did"}, {"agent_context", "tenant_id"}, {"agent_context", "session_id"},
	{"agent_context", "user_did"}, {"agent_context", "extra"},
	{"resource_limits"}, {"resource_limits", "cpu_millicore_limit"}, {"resource_limits", "timeout_seconds"}, {"resource_limits", "x"},
	{"execution_options"}, {"execution_options", "async_mode"}, {"execution_options", "priority"}, {"execution_options", "dry_run"},
	{"link"}, {"link", "parent"}, {"link", "action"}, {"link", "depth"}, {"link", "attempt"}, {"link", "hook"},
	{"redrive"}, {"redrive", "original"}, {"redrive", "depth"}, {"redrive", "principal"}, {"redrive", "principal", "session"},
	{"redrive", "principal", "claims"}, {"redrive", "proof"}, {"redrive", "proof", "body"},
	{"checkpoint_config"}, {"checkpoint_config", "checkpoint_interval_seconds"},
	{"document_context"}, {"document_context", "document_refs"}, {"document_context", "query"},
}

// fullRequest is a valid request that uses every part of the schema.
func fullRequest() map[string]any {
	return map[string]any{
		"tool_id": "echo", "tool_version": "^1.2", "invocation_id": "inv-1", "parameters": map[string]any{"message": "hi", "n": 2.5},
		"capability_token": "eyJ.x.y",
		"agent_context":    map[string]any{"agent_did": "did:agent:a", "tenant_id": "acme", "session_id": "s", "user_did": "did:user:u"},
		"resource_limits":  map[string]any{"cpu_millicore_limit": 100, "memory_mb_limit": 64, "timeout_seconds": 30, "network_bandwidth_mbps": 1},
		"execution_options": map[string]any{"async_mode": true, "priority": "high", "idempotency_key": "k", "require_approval": false,
			"dry_run": false},
		"link": map[string]any{"parent": "p", "root": "r", "hook": "h", "action": "retry", "depth": 1, "attempt": 16},
		"redrive": map[string]any{"original": "o", "root": "r", "depth": 2, "by": "op", "decision": true, "reason": "why",
			"principal": map[string]any{"session": "s", "claims": map[string]any{"sub": "x"}, "sig": "s", "seal": map[string]any{}},
			"proof":     map[string]any{"subject": "s", "headers": map[string]any{}, "body": "b"}},
		"checkpoint_config": map[string]any{"enable_checkpointing": true, "checkpoint_interval_seconds": 5, "resume_from_checkpoint_id": "c"},
		"document_context":  map[string]any{"document_refs": []any{"src:doc@1"}, "version_pinning": true, "query": "q"},
	}
}

// mutate sets or deletes the value at path, making the objects on the way.
func mutate(doc map[string]any, path []string, v any, del bool) {
	for _, k := range path[:len(path)-1] {
		next, ok := doc[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			doc[k] = next
		}
		doc = next
	}
	if del {
		delete(doc, path[len(path)-1])
		return
	}
	doc[path[len(path)-1]] = v
}

// TestVouchAgreesOnRequests holds Validate, with vouch, to the library's
// verdict and field errors (so to the same E-code in validate) over
// thousands of generated requests, valid and not, and checks that vouch
// takes the valid ones.
func TestVouchAgreesOnRequests(t *testing.T) {
	s := InvokeRequest()
	rng := rand.New(rand.NewPCG(1, 2))
	var valid, vouched int
	for i := range 3000 {
		doc := fullRequest()
		if i%3 == 0 {
			doc = validRequest()
		}
		for range rng.IntN(3) {
			path := requestKeys[rng.IntN(len(requestKeys))]
			mutate(doc, path, requestValues[rng.IntN(len(requestValues))], rng.IntN(5) == 0)
		}
		b := mustJSON(t, doc)
		if agree(t, s, b) {
			vouched++
		}
		if fields, err := libraryValidate(s, b); err == nil && fields == nil {
			valid++
		}
	}
	t.Logf("%d of 3000 generated requests valid, %d vouched for", valid, vouched)
	if valid < 500 || vouched < valid*9/10 {
		t.Fatalf("%d valid requests, %d vouched for: the generator or vouch lost its way", valid, vouched)
	}
}

// TestVouchAgreesOnSchemas checks vouch against the library over schemas
// with the keywords it knows, and ones it leaves to the library.
func TestVouchAgreesOnSchemas(t *testing.T) {
	cases := []struct {
		schema string
		docs   []string
		takes  string // a document vouch must take
	}{
		{`{"type":"object","required":["a"],"properties":{"a":{"type":"integer","minimum":-2,"exclusiveMaximum":5}},"additionalProperties":{"type":"string"}}`,
			[]string{`{"a":1}`, `{"a":5}`, `{"a":-2}`, `{"a":-3}`, `{"a":4.0}`, `{"a":4e0}`, `{"a":1,"b":"x"}`, `{"a":1,"b":2}`, `{}`, `[]`},
			`{"a":4,"b":"x"}`},
		{`{"type":["string","null"],"minLength":2,"maxLength":3,"pattern":"^a"}`,
			[]string{`"ab"`, `"abcd"`, `"a"`, `"ba"`, `null`, `"aéé"`, `"aééé"`, `1`}, `"aé"`},
		{`{"type":"array","minItems":1,"maxItems":2,"items":{"enum":["x","y",1]}}`,
			[]string{`["x"]`, `[]`, `["x","y","x"]`, `[1]`, `[1.0]`, `["z"]`}, `["x","y"]`},
		{`{"$defs":{"n":{"type":"number","maximum":1.5}},"properties":{"n":{"$ref":"#/$defs/n"},"c":{"const":"k"}},"allOf":[{"minProperties":1}]}`,
			[]string{`{"n":1}`, `{"n":1.5}`, `{"n":2}`, `{"c":"k"}`, `{"c":"j"}`, `{}`}, `{"c":"k"}`},
		{`{"anyOf":[{"type":"string"},{"type":"integer"}]}`, []string{`"s"`, `1`, `true`}, ""},
		{`{"type":"string","format":"email"}`, []string{`"a@b.c"`, `"nope"`}, ""},
		{`{"type":"integer","multipleOf":2}`, []string{`2`, `3`}, ""},
		{`{"minProperties":2,"maxProperties":2}`, []string{`{"a":1,"a":2}`, `{"a":1,"b":2,"a":3}`, `{"a":1}`}, `{"a":1,"b":2}`},
		{`{"properties":{"a":false,"b":true}}`, []string{`{"a":1}`, `{"b":1}`, `{}`}, `{"b":1}`},
		{`{"$schema":"http://json-schema.org/draft-07/schema#","items":{"type":"integer"},"additionalItems":false}`,
			[]string{`[1,2]`, `[1,"a"]`}, ""},
		{`{"$schema":"http://json-schema.org/draft-04/schema#","type":"integer","minimum":1,"exclusiveMinimum":true}`,
			[]string{`1`, `2`, `1.0`}, `2`},
	}
	for _, c := range cases {
		s, err := Compile("case", []byte(c.schema))
		if err != nil {
			t.Fatalf("%s: %v", c.schema, err)
		}
		for _, doc := range c.docs {
			agree(t, s, []byte(doc))
		}
		if c.takes != "" && !agree(t, s, []byte(c.takes)) {
			t.Errorf("%s: vouch left %s to the library", c.schema, c.takes)
		}
	}
}

// rawRequests are requests whose bytes differ from what they decode to:
// escapes, names given twice, odd spacing, nested strings holding
// brackets and quotes.
var rawRequests = []string{
	` { "tool_id" : "echo" , "agent_context" : { "agent_did" : "d" , "tenant_id" : "acme" } } `,
	"{\n\t\"tool_id\":\"echo\",\r\n\"agent_context\":{\"agent_did\":\"d\",\"tenant_id\":\"acme\"}}",
	`{"tool\u005fid":"echo","agent_context":{"agent_did":"d","tenant_id":"acme"}}`,
	`{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"ac\u006de"}}`,
	`{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"ac me"}}`,
	`{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"acme\n"}}`,
	`{"tool_id":"echo","tool_id":"","agent_context":{"agent_did":"d","tenant_id":"acme"}}`,
	`{"tool_id":"","tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"acme"}}`,
	`{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"acme","tenant_id":"a b"}}`,
	`{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"acme"},"parameters":{"a":"x\"}]","b":[{"c":[1,-2.5e+3,true,null]},"]}"],"d":{}}}`,
	`{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"acme"},"parameters":{"\"":1,"\\":[]}}`,
	`{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"acme"},"parameters":[]}`,
	`{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"acme"},"resource_limits":{"timeout_seconds":-0}}`,
	`{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"acme"},"resource_limits":{"timeout_seconds":1E1}}`,
	`{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"acme"},"resource_limits":{"timeout_seconds":10.0}}`,
	`{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"acme"},"resource_limits":{"timeout_seconds":9223372036854775808}}`,
	`{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"acme"},"execution_options":{"priority":"hi\u0067h"}}`,
	`{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"acme"},"execution_options":{"priority":"hig"}}`,
	`{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"acme"},"document_context":{"document_refs":["a",""]}}`,
	`{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"acme"},"document_context":{"document_refs":["a" , "b"]}}`,
	`{"tool_id":"\u00e9","agent_context":{"agent_did":"d","tenant_id":"acme"}}`,
	`{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"acme"}} x`,
	`{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"acme"}`,
	"{\"tool_id\":\"\xff\",\"agent_context\":{\"agent_did\":\"d\",\"tenant_id\":\"acme\"}}",
	`[]`, `"x"`, `null`, `1`, ``,
}

func TestVouchAgreesOnRawRequests(t *testing.T) {
	vouched := 0
	for _, doc := range rawRequests {
		if agree(t, InvokeRequest(), []byte(doc)) {
			vouched++
		}
	}
	if vouched < 5 {
		t.Fatalf("only %d raw requests vouched for", vouched)
	}
}

// FuzzVouch: whatever the document, Validate answers as the library alone
// does against the request schema.
func FuzzVouch(f *testing.F) {
	for i := range 8 {
		doc := fullRequest()
		mutate(doc, requestKeys[i*5%len(requestKeys)], requestValues[i*7%len(requestValues)], false)
		b, _ := json.Marshal(doc)
		f.Add(b)
	}
	f.Add([]byte(`{"tool_id":"echo","agent_context":{"agent_did":"did:agent:a","tenant_id":"acme"},"parameters":{"message":"hi"}}`))
	for _, doc := range rawRequests {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		agree(t, InvokeRequest(), doc)
	})
}
