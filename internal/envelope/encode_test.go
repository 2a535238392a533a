package envelope

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
)

// sameAfterAHop: inv, written by Encode and read by the readers of
// another process (Decode) and of this one (DecodeOwn), is the invocation
// encoding/json's writing of it reads back as.
func sameAfterAHop(t *testing.T, inv *Invocation) {
	t.Helper()
	std, err := json.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	want, err := decodeStd(std)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Encode(inv)
	if err != nil {
		t.Fatalf("Encode: %v (encoding/json wrote %s)", err, std)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatalf("Decode refused %s: %v", b, err)
	}
	sameInvocation(t, got, want)
	if got, err = DecodeOwn(b); err != nil {
		t.Fatalf("DecodeOwn refused %s: %v", b, err)
	}
	sameInvocation(t, got, want)
}

func TestEncodeReadsBackAsEncodingJSON(t *testing.T) {
	for _, e := range envelopes {
		inv, err := decodeStd([]byte(e))
		if err != nil {
			t.Fatal(err)
		}
		sameAfterAHop(t, inv)
	}
	inv := &Invocation{ID: "i", Tenant: "t", ReceivedAt: time.Now(), Status: api.StatusSuccess,
		Result: json.RawMessage(`{ "a" : [1, "<b>&\u2028"] }`), Origin: TraceContext{TraceParent: "00-x"},
		Authz: &Authorization{TokenID: "k", Grants: Grants{Hosts: []string{"*.example.com"}}}}
	inv.Fail("execute", api.NewError(api.ToolExecutionError, api.EInternal, "boom").WithDetail("k", "v").WithDetail("n", 3))
	sameAfterAHop(t, inv)
	sameAfterAHop(t, &Invocation{ID: "zero"})
}

// Encode refuses a raw field that is not JSON, as encoding/json does.
func TestEncodeRefusesBrokenRawFields(t *testing.T) {
	for _, raw := range []string{`{"a":}`, `{"a":1`, `nul`} {
		if _, err := Encode(&Invocation{ID: "i", Result: json.RawMessage(raw)}); err == nil {
			t.Errorf("encoded a result of %q", raw)
		}
	}
}

// FuzzEncode holds Encode to encoding/json: every invocation encoding/json
// reads, written by Encode, reads back as its encoding/json writing does.
func FuzzEncode(f *testing.F) {
	fuzzDecoded(f, func(t *testing.T, inv *Invocation) {
		if _, err := json.Marshal(inv); err != nil {
			return // nothing encoding/json hands on
		}
		sameAfterAHop(t, inv)
	})
}
