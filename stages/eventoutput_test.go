package stages

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
)

// FuzzEventOutput: an event's bytes are compact JSON with the value
// json.Marshal makes of it, whatever its attributes and data hold (HTML,
// unicode, escapes): only json.Marshal's second scan is saved, which also
// escapes <, > and & in the attributes.
func FuzzEventOutput(f *testing.F) {
	f.Add("hello", `{"a":[1,2.5e10,"x"]}`)
	f.Add("<script>&amp;</script>", `{"html":"<b>&</b>","u":"\u2028\u00e9"}`)
	f.Add("line\nbreak\"quote\\", `"plain"`)
	f.Fuzz(func(t *testing.T, text, raw string) {
		var data any = map[string]any{"text": text}
		if json.Valid([]byte(raw)) {
			data = map[string]any{"text": text, "raw": json.RawMessage(raw)}
		}
		inv := &envelope.Invocation{ID: "inv-" + text, Tenant: "acme", Event: envelope.Event{Seq: 7, Source: "urn:" + text}}
		e, err := inv.NewEvent("urn:toolgate:audit", api.TypeSucceeded, data)
		if err != nil {
			t.Skip()
		}
		o, err := EventOutput("audit.acme.x", e)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, o.Data); err != nil || !bytes.Equal(compact.Bytes(), o.Data) {
			t.Fatalf("not compact JSON (%v): %s", err, o.Data)
		}
		var got, exp any
		if err := json.Unmarshal(o.Data, &got); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(want, &exp); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, exp) {
			t.Fatalf("event\n%s\nwant\n%s", o.Data, want)
		}
	})
}

// BenchmarkEventOutput is an audit event of a call with a 500-byte
// result as its data, as audit's ending writes one.
func BenchmarkEventOutput(b *testing.B) {
	inv := &envelope.Invocation{ID: "inv-1", Tenant: "acme", Event: envelope.Event{Seq: 7, Source: "urn:agent"}}
	data := map[string]any{"result": json.RawMessage(`{"echo":"` + strings.Repeat("x", 500) + `"}`)}
	b.ReportAllocs()
	for b.Loop() {
		e, err := inv.NewEvent("urn:toolgate:audit", api.TypeSucceeded, data)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := EventOutput("audit.acme.x", e); err != nil {
			b.Fatal(err)
		}
	}
}

// TestInvocationEventIsTheSDKs: the events InvocationEvent writes itself
// are byte for byte the SDK's encoding of the event inv.NewEvent makes,
// as other builds write and verify them, and its data ends where it says.
func TestInvocationEventIsTheSDKs(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 600700800, time.FixedZone("x", 3600))
	record := (&envelope.Invocation{ID: "inv-1", Tenant: "acme", Status: api.StatusSuccess,
		Request: &api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"m":"<b>é"}`)}}).Audit()
	for _, c := range []struct {
		name string
		inv  envelope.Invocation
		src  string
		data any
		at   time.Time
	}{
		{"audit record", envelope.Invocation{ID: "inv-1", Tenant: "acme"}, "urn:toolgate:audit", record, at},
		{"no time", envelope.Invocation{ID: "inv-1", Tenant: "acme"}, "urn:toolgate:audit", record, time.Time{}},
		{"trace", envelope.Invocation{ID: "i", Tenant: "t", TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
			TraceState: "congo=t61rcWkgMzE, rojo=00f067aa0ba902b7"}, "urn:toolgate:execute", map[string]any{"a": "<&>"}, at},
		{"origin", envelope.Invocation{ID: "i", Tenant: "t", TraceParent: "00-aa-bb-01", Origin: envelope.TraceContext{TraceParent: "00-cc-dd-01"}},
			"urn:toolgate:audit", api.Response{InvocationID: "i", Status: api.StatusSuccess, Result: json.RawMessage(`{"x":[1,2]}`)}, at},
		{"state without parent", envelope.Invocation{ID: "i", Tenant: "t", TraceState: "k=v"}, "urn:toolgate:verify", record, at},
		{"empty tenant", envelope.Invocation{ID: "i"}, "urn:toolgate:audit", record, at},
		{"escaped id", envelope.Invocation{ID: "i\"<é", Tenant: "t"}, "urn:toolgate:audit", record, at},
		{"spaced id", envelope.Invocation{ID: " i ", Tenant: "t"}, "urn:toolgate:audit", record, at},
		{"escaped tenant", envelope.Invocation{ID: "i", Tenant: "a&b"}, "urn:toolgate:audit", record, at},
		{"other source", envelope.Invocation{ID: "i", Tenant: "t"}, "urn:toolgate:a/b?c", record, at},
		{"raw data", envelope.Invocation{ID: "i", Tenant: "t"}, "urn:toolgate:audit", []byte(`{"raw":true}`), at},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, err := c.inv.NewEvent(c.src, api.TypeSucceeded, c.data)
			if err != nil {
				t.Fatal(err)
			}
			e.SetTime(c.at)
			want, err := e.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			o, end, err := InvocationEvent("s", &c.inv, c.src, api.TypeSucceeded, c.data, c.at)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(o.Data, want) {
				t.Fatalf("event\n%s\nthe SDK's\n%s", o.Data, want)
			}
			if _, raw := c.data.([]byte); raw {
				return // written in base64: no index of its own
			}
			if d := e.Data(); !bytes.Equal(o.Data[end+1-len(d):end+1], d) {
				t.Fatalf("data ends at %d of\n%s", end, o.Data)
			}
			if o.Subject != "s" || o.Header["Content-Type"][0] != event.ApplicationCloudEventsJSON {
				t.Fatalf("output %+v", o)
			}
		})
	}
}

// FuzzInvocationEvent holds InvocationEvent to the SDK's bytes whatever
// the invocation's strings hold.
func FuzzInvocationEvent(f *testing.F) {
	f.Add("inv-1", "acme", "00-aa-bb-01", "k=v", "audit", `{"a":1}`)
	f.Add("i\u2028", "a<b", "", "x", "a b", `"<&>"`)
	f.Fuzz(func(t *testing.T, id, tenant, parent, state, stage, raw string) {
		inv := &envelope.Invocation{ID: id, Tenant: tenant, TraceParent: parent, TraceState: state}
		var data any = map[string]any{"s": raw}
		if json.Valid([]byte(raw)) {
			data = map[string]any{"raw": json.RawMessage(raw)}
		}
		e, err := inv.NewEvent("urn:toolgate:"+stage, api.TypeInvoked, data)
		if err != nil {
			t.Skip()
		}
		now := time.Now()
		e.SetTime(now)
		want, werr := e.MarshalJSON()
		o, _, err := InvocationEvent("s", inv, "urn:toolgate:"+stage, api.TypeInvoked, data, now)
		if (err != nil) != (werr != nil) || (err == nil && !bytes.Equal(o.Data, want)) {
			t.Fatalf("event (%v)\n%s\nthe SDK's (%v)\n%s", err, o.Data, werr, want)
		}
	})
}

// BenchmarkAuditEvent is the terminal audit event of a call, its record
// as data, as audit publishes one per call.
func BenchmarkAuditEvent(b *testing.B) {
	inv := &envelope.Invocation{ID: "inv-1", Tenant: "acme", Event: envelope.Event{Seq: 7, Source: "urn:agent"},
		TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		Request: &api.Request{ToolID: "echo", ToolVersion: "1.0.0", Parameters: json.RawMessage(`{"path":"/reports/a.txt","n":1}`),
			AgentContext: api.AgentContext{AgentDID: "did:agent:a", TenantID: "acme", SessionID: "s1"}}}
	inv.Succeed("verify", json.RawMessage(`{"echo":"`+strings.Repeat("x", 500)+`"}`))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := AuditEvent("audit", inv, envelope.TerminalType(inv), inv.Audit()); err != nil {
			b.Fatal(err)
		}
	}
}
