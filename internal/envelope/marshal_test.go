package envelope

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
)

// sameAsStd: Marshal writes what json.Marshal writes, byte for byte, or
// fails where it fails.
func sameAsStd(t *testing.T, v any) {
	t.Helper()
	want, werr := json.Marshal(v)
	got, err := Marshal(v)
	if (err != nil) != (werr != nil) || !bytes.Equal(got, want) {
		t.Fatalf("Marshal(%T) = %s, %v; encoding/json: %s, %v", v, got, err, want, werr)
	}
}

// The values each hop encodes for digests and audit events, from the
// envelopes of the tests: the request, the authorization (omitzero
// within: encoding/json's), the audit record, the response, raw values
// with spaces, HTML and U+2028, invalid UTF-8, floats, times.
func TestMarshalIsEncodingJSON(t *testing.T) {
	for _, e := range envelopes {
		inv, err := decodeStd([]byte(e))
		if err != nil {
			t.Fatal(err)
		}
		sameAsStd(t, inv.Request)
		sameAsStd(t, inv.Authz)
		sameAsStd(t, inv.Audit())
		sameAsStd(t, api.Response{InvocationID: inv.ID, Status: inv.Status, Result: inv.Result, Error: inv.Error})
	}
	req := &api.Request{ToolID: "t<>&", Parameters: json.RawMessage("{ \"a\" : [1.50, \"<b>&\u2028\xff\"] }"),
		AgentContext: api.AgentContext{AgentDID: "did:\xffx", SessionID: "s\u2029"}}
	sameAsStd(t, req)
	inv := &Invocation{ID: "i", Tenant: "t", Request: req, Status: api.StatusError, ReceivedAt: time.Now()}
	inv.Fail("execute", api.NewError(api.ToolExecutionError, api.EInternal, "boom <x>").
		WithDetail("n", 3.25).WithDetail("big", 1e21).WithDetail("m", map[string]any{"z": 1, "a": []any{"<", nil, true}}).
		WithDetail("at", time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600))))
	sameAsStd(t, inv.Audit())
	sameAsStd(t, api.Response{InvocationID: "i", Status: inv.Status, Error: inv.Error})
	sameAsStd(t, map[string]any{"k": 1})
}

// A value that holds an omitzero field, directly or in an interface, is
// encoding/json's: the fast codec would write its zero value.
func TestMarshalLeavesOmitzeroToEncodingJSON(t *testing.T) {
	type withZero struct {
		At time.Time `json:"at,omitzero"`
	}
	if fastValue(reflect.ValueOf(withZero{})) || fastValue(reflect.ValueOf(map[string]any{"x": withZero{}})) {
		t.Fatal("an omitzero field taken for the fast codec")
	}
	if !fastValue(reflect.ValueOf(map[string]any{"x": 1})) || !fastValue(reflect.ValueOf(&api.Request{})) {
		t.Fatal("a value without omitzero left to encoding/json")
	}
	sameAsStd(t, withZero{})
	sameAsStd(t, map[string]any{"x": withZero{}})
	sameAsStd(t, &Authorization{TokenID: "k"})
}

// FuzzMarshal holds Marshal to json.Marshal over every invocation
// encoding/json reads: its request, authorization, audit record and
// response.
func FuzzMarshal(f *testing.F) {
	fuzzDecoded(f, func(t *testing.T, inv *Invocation) {
		sameAsStd(t, inv.Request)
		sameAsStd(t, inv.Authz)
		sameAsStd(t, inv.Audit())
		sameAsStd(t, api.Response{InvocationID: inv.ID, Status: inv.Status, Result: inv.Result, Error: inv.Error})
	})
}

// BenchmarkAuditEvent is an audit event of a call, its record as data:
// one per event every call publishes.
func BenchmarkAuditEvent(b *testing.B) {
	inv, err := decodeStd([]byte(envelopes[0]))
	if err != nil {
		b.Fatal(err)
	}
	rec := inv.Audit()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := inv.NewEvent("urn:toolgate:audit", api.TypeInvoked, rec); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMarshal sets Marshal beside json.Marshal on an audit record
// and a request.
func BenchmarkMarshal(b *testing.B) {
	inv, err := decodeStd([]byte(envelopes[0]))
	if err != nil {
		b.Fatal(err)
	}
	inv.Fail("execute", api.NewError(api.ToolExecutionError, api.EInternal, "boom").WithDetail("n", 3))
	for _, c := range []struct {
		name string
		v    any
	}{{"record", inv.Audit()}, {"request", inv.Request}} {
		for _, m := range []struct {
			name string
			f    func(any) ([]byte, error)
		}{{"encoding-json", json.Marshal}, {"Marshal", Marshal}} {
			b.Run(c.name+"/"+m.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := m.f(c.v); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
