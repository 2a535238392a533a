package envelope

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	segjson "github.com/segmentio/encoding/json"
	"github.com/toolgate/toolgate/api"
)

// sealedInvocation is a call as authorize hands it on: request, principal
// and sealed authorization.
func sealedInvocation() *Invocation {
	return &Invocation{ID: "i-1", Tenant: "acme", Event: Event{ID: "i-1", Source: "s", Type: "tool.invoke", Seq: 501},
		ReceivedAt: time.Date(2026, 11, 23, 23, 2, 19, 0, time.UTC), TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		Request: &api.Request{ToolID: "fs.read_file", ToolVersion: "1.2.0", Parameters: json.RawMessage(`{"path":"/tmp/<a>&b"}`),
			AgentContext: api.AgentContext{AgentDID: "did:agent:a", TenantID: "acme", SessionID: "s-1"}},
		Principal: &Principal{Session: "tok-root", Claims: json.RawMessage(`{"sub":"did:agent:a","scope":["fs.*"]}`), Sig: "cHJpbmNpcGFs"},
		Custody:   "Y3VzdG9keQ",
		Authz: &Authorization{TokenID: "tok-1", AgentDID: "did:agent:a", Session: "tok-root", Reserved: true,
			Grants: Grants{Paths: []string{"/tmp"}, PathMode: "ro"},
			Seal: &Seal{Key: "N123", Tenant: "acme", ID: "i-1", Seq: 501, ToolID: "fs.read_file", ToolVersion: "1.2.0",
				Request: "aa", Authz: "bb", Decision: "allow", Expires: 1, Sig: "c2ln"}},
		Status:   api.StatusPending,
		Metadata: api.ExecutionMetadata{Stages: []api.Hop{{Stage: "validate", DurationUS: 12}, {Stage: "authorize", DurationUS: 80}}},
	}
}

// wholeEncoding is what the previous build's Encode wrote: segmentio's
// codec over the whole envelope.
func wholeEncoding(t testing.TB, inv *Invocation) []byte {
	t.Helper()
	b, err := segjson.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sameEncoding(t testing.TB, inv *Invocation, what string) []byte {
	t.Helper()
	got, err := Encode(inv)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if want := wholeEncoding(t, inv); !bytes.Equal(got, want) {
		t.Fatalf("%s: Encode wrote\n%s\nthe whole envelope's encoding is\n%s", what, got, want)
	}
	return got
}

// TestEncodeKeepsSealedParts: the bytes of a sealed call's request,
// principal and authorization are written again from the last Encode
// while the invocation holds the same ones, and the envelope's bytes are
// always those of the whole envelope's encoding (the previous build's),
// whatever else a stage changed; a part replaced, or resealed, is written
// afresh.
func TestEncodeKeepsSealedParts(t *testing.T) {
	inv := sealedInvocation()
	first := sameEncoding(t, inv, "first hop")
	if inv.kept == nil || inv.kept.parts[0].ptr == nil {
		t.Fatal("nothing was kept of a sealed call")
	}
	// The stage after reads it, changes what a stage changes, hands it on.
	inv.Metadata.Stages = append(inv.Metadata.Stages, api.Hop{Stage: "route", DurationUS: 40})
	inv.Custody, inv.TraceParent = "b3RoZXI", ""
	inv.Route = &Route{ToolID: "fs.read_file", ToolVersion: "1.2.0", Executor: "process"}
	second := sameEncoding(t, inv, "a hop that kept the parts")
	if k := inv.kept.parts[0]; &k.data[0] != &second[k.at] || !bytes.Contains(first, k.data) {
		t.Fatal("the kept request is not the first hop's bytes, written into the second's")
	}
	// The fields before the request are written again while they hold
	// the same values, and afresh once one changed (the traceparent above).
	inv.Custody = "dGhpcmQ"
	third := sameEncoding(t, inv, "a hop that kept the head")
	if h := inv.kept.headData; len(h) == 0 || &h[0] != &third[1] || !bytes.HasPrefix(second[1:], h) {
		t.Fatal("the head is not the second hop's bytes, written into the third's")
	}
	for _, change := range []func(){
		func() { inv.Event.Seq++ },
		func() { inv.ReceivedAt = inv.ReceivedAt.Add(time.Microsecond) },
		func() { inv.Origin.TraceState = "k=v" },
		func() { inv.Data = json.RawMessage(`{"raw":1}`) },
		func() { inv.Data = nil },
	} {
		change()
		sameEncoding(t, inv, "a hop that changed the head")
	}
	// Bytes kept are written as they are: a part changed in place without
	// a new seal (which execute refuses) is not written again.
	inv.Principal.Session = "changed in place"
	if b, _ := Encode(inv); !bytes.Contains(b, []byte(`"session":"tok-root"`)) {
		t.Fatalf("the kept principal was encoded again:\n%s", b)
	}
	inv.Principal = &Principal{Session: "replaced", Claims: json.RawMessage(`{}`)}
	sameEncoding(t, inv, "a principal replaced")
	inv.Request.CapabilityToken = "changed in place, then sealed again"
	inv.Authz.Seal = &Seal{Sig: "bmV3"}
	b := sameEncoding(t, inv, "a request changed in place and sealed again")
	if !bytes.Contains(b, []byte("sealed again")) {
		t.Fatal("a resealed request was not encoded afresh")
	}
	inv.Authz = nil
	inv.Succeed("execute", json.RawMessage(`{"ok":true}`))
	sameEncoding(t, inv, "no authorization")
	sameEncoding(t, &Invocation{ID: "bare", Authz: &Authorization{Seal: &Seal{Sig: "x"}}}, "only a sealed authorization")
}

// TestEncodeKeepsResult: a result the last Encode wrote is written again
// from its bytes while the invocation holds those very bytes, whatever
// slice holds them; one changed in place, or one the codec writes
// otherwise than it holds it (spaced, or HTML to escape), is encoded
// afresh, and the envelope's bytes are always the whole envelope's.
func TestEncodeKeepsResult(t *testing.T) {
	inv := sealedInvocation()
	inv.Succeed("execute", json.RawMessage(`{"content":[{"type":"text","text":"hi"}]}`))
	sameEncoding(t, inv, "the first hop with a result")
	last := len(inv.kept.parts) - 1
	inv.Metadata.Stages = append(inv.Metadata.Stages, api.Hop{Stage: "verify"})
	inv.Result = bytes.Clone(inv.Result) // as a decode would hold it
	second := sameEncoding(t, inv, "a hop that kept the result")
	if k := inv.kept.parts[last]; !bytes.Equal(k.data, inv.Result) || &k.data[0] != &second[k.at] {
		t.Fatalf("the result was not kept: %q", k.data)
	}
	// Changed in place, to the same length: its bytes are no longer the
	// ones written, and are encoded.
	copy(inv.Result[len(`{"content":[{"type":"text","text":"`):], "no")
	if b := sameEncoding(t, inv, "a result changed in place"); !bytes.Contains(b, []byte(`"text":"no"`)) {
		t.Fatalf("a result changed in place was written as it was:\n%s", b)
	}
	for _, r := range []string{`{"a": 1}`, `"<b>"`, `{"a": 1}`} {
		inv.Result = json.RawMessage(r)
		sameEncoding(t, inv, "a result the codec rewrites")
		sameEncoding(t, inv, "that result again")
	}
	inv.Result = json.RawMessage(`{"a":`)
	if _, err := Encode(inv); err == nil {
		t.Fatal("a result that is not JSON was written")
	}
	inv.Result = nil
	sameEncoding(t, inv, "no result")
}

// TestEncodeOldBytes: the bytes the previous build wrote of a hop decode
// and, handed on unchanged, encode to the very same bytes, on the first
// hop after the decode and on the hops after that, which write the kept
// parts again.
func TestEncodeOldBytes(t *testing.T) {
	old := wholeEncoding(t, sealedInvocation())
	for _, decode := range []func([]byte) (*Invocation, error){Decode, DecodeOwn, decodeStd} {
		inv, err := decode(old)
		if err != nil {
			t.Fatal(err)
		}
		for hop := range 3 {
			b, err := Encode(inv)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b, old) {
				t.Fatalf("hop %d wrote\n%s\nthe previous build wrote\n%s", hop, b, old)
			}
		}
	}
}

// FuzzEncodeKept holds Encode of a sealed call to the whole envelope's
// encoding, on the first hop and on the next, which writes its kept parts
// again.
func FuzzEncodeKept(f *testing.F) {
	f.Add(wholeEncoding(f, sealedInvocation()))
	fuzzDecoded(f, func(t *testing.T, inv *Invocation) {
		if _, err := segjson.Marshal(inv); err != nil {
			if _, err := Encode(inv); err == nil {
				t.Fatal("Encode wrote what the whole envelope's encoding refuses")
			}
			return
		}
		if inv.Authz == nil {
			inv.Authz = &Authorization{}
		}
		if inv.Authz.Seal == nil {
			inv.Authz.Seal = &Seal{Sig: "c2ln"}
		}
		sameEncoding(t, inv, "first hop")
		inv.Metadata.Stages = append(inv.Metadata.Stages, api.Hop{Stage: "route"})
		sameEncoding(t, inv, "next hop")
	})
}

// BenchmarkEncode: a sealed call's hand-off written whole (the previous
// build's Encode) and with its kept parts written again, with a small
// request and principal, with ones of half a kilobyte each, and with a
// result of a kilobyte.
func BenchmarkEncode(b *testing.B) {
	large := func() *Invocation {
		inv := sealedInvocation()
		inv.Request.Parameters = json.RawMessage(`{"path":"` + strings.Repeat("reports/q3/", 45) + `"}`)
		inv.Principal.Claims = json.RawMessage(`{"sub":"did:agent:a","scope":["` + strings.Repeat("fs.read_file", 40) + `"]}`)
		return inv
	}
	// A tool's result of a kilobyte, handed on by verify to audit.
	result := func() *Invocation {
		inv := sealedInvocation()
		inv.Succeed("execute", json.RawMessage(`{"content":[{"type":"text","text":"`+strings.Repeat("line of output ", 70)+`"}]}`))
		return inv
	}
	for name, mk := range map[string]func() *Invocation{"small": sealedInvocation, "large": large, "result": result} {
		b.Run(name+"/whole", func(b *testing.B) {
			inv := mk()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := segjson.Marshal(inv); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/kept", func(b *testing.B) {
			inv := mk()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Encode(inv); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
