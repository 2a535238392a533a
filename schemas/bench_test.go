package schemas

import "testing"

// BenchmarkValidate is Validate of a valid document: a request as an agent
// sends it, one using most of the request schema, and a tool's parameters.
func BenchmarkValidate(b *testing.B) {
	input, err := Compile("input", []byte(`{"type":"object","required":["message"],"properties":{"message":{"type":"string","maxLength":4096}}}`))
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		doc  string
	}{
		{"request", `{"tool_id":"echo","agent_context":{"agent_did":"did:agent:a","tenant_id":"acme"},"parameters":{"message":"hi"},` +
			`"capability_token":"eyJhbGciOiJFZERTQSJ9.eyJ0b29sX2lkIjoiKiIsImFnZW50X2RpZCI6ImRpZDphZ2VudDpkZW1vIn0.c2lnbmF0dXJl"}`},
		{"request-full", `{"tool_id":"echo","tool_version":"^1.2","invocation_id":"inv-1","parameters":{"message":"hi","n":[1,2,{"x":null}]},` +
			`"agent_context":{"agent_did":"did:agent:a","tenant_id":"acme","session_id":"s"},"resource_limits":{"timeout_seconds":30,"memory_mb_limit":64},` +
			`"execution_options":{"async_mode":false,"priority":"high","idempotency_key":"k"},"document_context":{"document_refs":["src:doc@1"],"query":"q"}}`},
		{"input", `{"message":"hello, world"}`},
	} {
		s := InvokeRequest()
		if c.name == "input" {
			s = input
		}
		doc := []byte(c.doc)
		if f, err := Validate(s, doc); err != nil || f != nil {
			b.Fatal(f, err)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = Validate(s, doc)
			}
		})
		b.Run(c.name+"/scanned", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = ValidateJSON(s, doc)
			}
		})
	}
}
