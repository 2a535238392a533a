package envelope

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
)

// envelopes are hand-offs as the stages write them, first to last hop.
var envelopes = []string{
	`{"id":"i-1","tenant":"acme","event":{"id":"i-1","source":"urn:toolgate:client","type":"tool.invoke","specversion":"1.0","time":"2026-11-23T23:02:19.385554683Z","mode":"binary","size":796,"seq":501},"received_at":"2026-11-23T23:02:19.388280282Z","request":{"tool_id":"noop","agent_context":{"agent_did":"did:agent:bench","tenant_id":"acme","session_id":"s0"},"parameters":{},"capability_token":"eyJhbGciOiJFZERTQSJ9.eyJ0b29sX2lkIjoiKiJ9.3QTo"},"status":"pending","metadata":{"duration_ms":0,"stages":[{"stage":"validate","duration_us":334}]}}`,
	`{"id":"i-1","tenant":"acme","event":{"id":"i-1","source":"s","type":"tool.invoke","specversion":"1.0","mode":"structured","size":10,"seq":2},"received_at":"2026-11-23T23:02:19.388280282+01:00","traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tracestate":"a=b","origin":{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},"request":{"tool_id":"fs.read","tool_version":"^1.0","agent_context":{"agent_did":"did:a","tenant_id":"acme","session_id":"s","user_did":"did:u"},"parameters":{"path":"/data/x","n":[1,2.5,-3e2,null,true],"s":"\u00e9\ud83d\ude00\n"},"resource_limits":{"timeout_ms":100},"execution_options":{"priority":"high","idempotency_key":"k"}},"principal":{"session":"token:t","claims":{"tool_id":"*","exp":1795478537}},"authz":{"token_id":"t","agent_did":"did:a","session":"token:t","token_budget":"token:c","budget_reserved":true,"cost_per_call":0.25,"approved_by":"op","grants":{"paths":["/data"],"path_mode":"ro","hosts":["*.example.com"],"ports":[443],"secrets":["k"]},"seal":{"key":"N","tenant":"acme","id":"i-1","seq":2,"tool_id":"fs.read","tool_version":"1.0.0","request":"ab","authz":"cd","decision":"allow","exp":1795478537000,"sig":"xy"}},"route":{"tool_id":"fs.read","tool_version":"1.0.0","executor":"builtin"},"status":"success","result":{"content":"a\"b","list":[]},"metadata":{"duration_ms":3,"started_at":"2026-11-23T23:02:19.393984622Z","completed_at":"2026-11-23T23:02:19.393992387Z","executor":"builtin","attempts":2,"stages":[{"stage":"validate","duration_us":334},{"stage":"verify","duration_us":62}]},"ended_by":"verify","findings":[{"rule":"r","detector":"secret","path":"$.content","action":"redact","rules_version":"1","count":2}]}`,
	`{"id":"seq-9","tenant":"_system","event":{"id":"","source":"","type":"","specversion":"","mode":"","size":3,"seq":9},"received_at":"0001-01-01T00:00:00Z","data":{"x":1},"status":"error","error":{"code":"INVALID_PARAMETERS","message":"m","details":{"ecode":"E3019","tenant":"a b"},"retryable":false},"metadata":{"duration_ms":0},"ended_by":"validate"}`,
}

// fuzzDecoded fuzzes check over every invocation encoding/json reads,
// seeded with the test envelopes.
func fuzzDecoded(f *testing.F, check func(t *testing.T, inv *Invocation)) {
	for _, e := range envelopes {
		f.Add([]byte(e))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if inv, err := decodeStd(data); err == nil {
			check(t, inv)
		}
	})
}

func decodeStd(data []byte) (*Invocation, error) {
	var inv Invocation
	if err := json.Unmarshal(data, &inv); err != nil {
		return nil, err
	}
	return &inv, nil
}

func TestDecodeMatchesEncodingJSON(t *testing.T) {
	for i, e := range envelopes {
		want, err := decodeStd([]byte(e))
		if err != nil {
			t.Fatalf("envelope %d: %v", i, err)
		}
		got, err := Decode([]byte(e))
		if err != nil {
			t.Fatalf("envelope %d: %v", i, err)
		}
		sameInvocation(t, got, want)
		if got, err = DecodeOwn([]byte(e)); err != nil {
			t.Fatalf("envelope %d, DecodeOwn: %v", i, err)
		}
		sameInvocation(t, got, want)
	}
	inv := &Invocation{ID: "i", Tenant: "t", ReceivedAt: time.Now(), Status: api.StatusSuccess, Result: json.RawMessage(`{"a":1}`)}
	inv.Fail("execute", api.NewError(api.ToolExecutionError, api.EInternal, "boom").WithDetail("k", "v"))
	b, err := json.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := decodeStd(b)
	sameInvocation(t, got, want)
	if got.Error == nil || got.Error.ECode != api.EInternal || got.Error.Details["k"] != "v" {
		t.Fatalf("error decoded as %+v", got.Error)
	}
}

// The decoded envelope does not share memory with the message it came from.
func TestDecodeCopies(t *testing.T) {
	buf := []byte(envelopes[1])
	got, err := Decode(buf)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := decodeStd([]byte(envelopes[1]))
	for i := range buf {
		buf[i] = 'x'
	}
	sameInvocation(t, got, want)
}

func TestDecodeRefusesWhatEncodingJSONRefuses(t *testing.T) {
	for _, bad := range []string{``, `{`, `{"id":1}`, `{"id":"a"}x`, `{"id":"a",}`, `{"received_at":"yesterday"}`,
		`{"event":{"seq":-1}}`, `{"metadata":{"stages":{}}}`, `{"result":{"a":}}`, `{"id":"\x"}`, `[]`, `null x`} {
		if _, err := decodeStd([]byte(bad)); err == nil {
			continue // not a refusal: nothing to hold Decode to
		}
		if _, err := Decode([]byte(bad)); err == nil {
			t.Errorf("Decode accepted %q, which encoding/json refuses", bad)
		}
	}
}

func sameInvocation(t *testing.T, got, want *Invocation) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		t.Fatalf("decoded\n%s\nwant\n%s", g, w)
	}
}

// FuzzDecode holds Decode to encoding/json on what the stages hand on:
// every Invocation encoding/json writes reads back the same. Other bytes
// (hops are written by workers only, and execute checks the seal on what
// it decoded) need only not crash it, and what it accepts must encode again.
func FuzzDecode(f *testing.F) {
	for _, e := range envelopes {
		f.Add([]byte(e))
	}
	f.Add([]byte(`{"id":"a","status":"x","metadata":{"stages":[null]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, err := Decode(data); err == nil {
			if _, err := json.Marshal(got); err != nil {
				t.Fatalf("decoded an envelope that does not encode: %v", err)
			}
		}
		v, err := decodeStd(data)
		if err != nil {
			return
		}
		written, err := json.Marshal(v)
		if err != nil {
			return
		}
		want, err := decodeStd(written)
		if err != nil {
			t.Fatalf("encoding/json does not read what it wrote: %v", err)
		}
		got, err := Decode(written)
		if err != nil {
			t.Fatalf("Decode refused %s: %v", written, err)
		}
		sameInvocation(t, got, want)
	})
}
