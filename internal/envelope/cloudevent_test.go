package envelope

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

const reqJSON = `{"tool_id":"echo","agent_context":{"agent_did":"did:agent:a","tenant_id":"acme"},"parameters":{"message":"hi"}}`

func binaryHeader() nats.Header {
	h := nats.Header{}
	h.Set("ce-specversion", "1.0")
	h.Set("ce-id", "inv-1")
	h.Set("ce-source", "urn:agent:a")
	h.Set("ce-type", EventType)
	h.Set("ce-traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	h.Set("content-type", "application/json")
	return h
}

func TestFromMessageBinary(t *testing.T) {
	inv, err := FromMessage("tool.invoke.acme", binaryHeader(), []byte(reqJSON), 7, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if inv.ID != "inv-1" || inv.Tenant != "acme" || inv.Event.Type != EventType || inv.Event.Mode != "binary" {
		t.Fatalf("decoded %+v", inv)
	}
	if inv.TraceParent == "" {
		t.Fatal("traceparent extension was not carried")
	}
	if string(inv.Data) != reqJSON {
		t.Fatalf("data = %s", inv.Data)
	}
}

func TestFromMessageStructured(t *testing.T) {
	body := `{"specversion":"1.0","id":"inv-2","source":"urn:agent:a","type":"tool.invoke","datacontenttype":"application/json","data":` + reqJSON + `}`
	h := nats.Header{}
	h.Set("Content-Type", "application/cloudevents+json; charset=utf-8")
	inv, err := FromMessage("tool.invoke.acme", h, []byte(body), 8, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var req api.Request
	if err := json.Unmarshal(inv.Data, &req); err != nil || req.ToolID != "echo" {
		t.Fatalf("data %s: %v", inv.Data, err)
	}
	if inv.ID != "inv-2" || inv.Event.Mode != "structured" {
		t.Fatalf("decoded %+v", inv)
	}
}

func TestFromMessageRejects(t *testing.T) {
	missingSource := binaryHeader()
	missingSource.Del("ce-source")
	xml := binaryHeader()
	xml.Set("content-type", "application/xml")
	structured := nats.Header{"content-type": {"application/cloudevents+json"}}
	cases := []struct {
		name   string
		header nats.Header
		body   string
		ecode  string
		id     string
	}{
		{"plain JSON, no CloudEvent", nats.Header{}, reqJSON, api.EMalformedEvent, "seq-9"},
		{"no headers at all", nil, "garbage", api.EMalformedEvent, "seq-9"},
		{"structured but not JSON", structured, "{not json", api.EMalformedEvent, "seq-9"},
		{"structured missing id", structured, `{"specversion":"1.0","source":"s","type":"tool.invoke"}`, api.EInvalidAttribute, "seq-9"},
		{"binary missing source", missingSource, reqJSON, api.EInvalidAttribute, "inv-1"},
		{"data not JSON", xml, "<x/>", api.EInvalidAttribute, "inv-1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			inv, err := FromMessage("tool.invoke.acme", c.header, []byte(c.body), 9, time.Now())
			if inv == nil || inv.ID != c.id || inv.Tenant != "acme" {
				t.Fatalf("invocation %+v, want id %s", inv, c.id)
			}
			var te *api.Error
			if !errors.As(err, &te) || te.ECode != c.ecode {
				t.Fatalf("err = %v, want %s", err, c.ecode)
			}
		})
	}
}

// TestBinaryRoundTrip: what api.Event encodes in binary mode (as the SDK
// publishes) is what FromMessage reads.
func TestBinaryRoundTrip(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	e := &api.Event{ID: "inv-3", Source: "urn:toolgate:cli", Type: EventType, Time: at,
		Extensions:      map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		DataContentType: "application/json", Data: json.RawMessage(reqJSON)}
	h, body, err := e.Binary()
	if err != nil {
		t.Fatal(err)
	}
	if nats.Header(h).Get(nats.MsgIdHdr) != MsgID("urn:toolgate:cli", "inv-3") {
		t.Fatal("Nats-Msg-Id is not derived from source and id")
	}
	inv, err := FromMessage("tool.invoke.acme", h, body, 1, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if inv.ID != "inv-3" || !inv.Event.Time.Equal(at) || inv.TraceParent == "" || string(inv.Data) != reqJSON {
		t.Fatalf("round trip lost attributes: %+v data=%s", inv, inv.Data)
	}
}

func TestMsgIDDistinguishesSources(t *testing.T) {
	first, again := MsgID("a", "1"), MsgID("a", "1")
	if first != again || first == MsgID("b", "1") || MsgID("a\x00b", "") == MsgID("a", "b") {
		t.Fatal("MsgID must be a function of (source, id) and keep them apart")
	}
}

// FuzzFromMessage feeds arbitrary subjects, headers and bodies to the ingest
// decoder: it must never panic, must always return an invocation with an id,
// every error must carry a stable code, and whatever it returns can be
// encoded (the hand-off to the next stage) with a tenant and id that make
// valid subjects and keys.
func FuzzFromMessage(f *testing.F) {
	f.Add("t", "ce-specversion", "1.0", "ce-id", "x", []byte(reqJSON))
	f.Add("t", "content-type", "application/cloudevents+json", "x", "y", []byte(`{"specversion":"1.0","id":"1","source":"s","type":"t","data":{}}`))
	f.Add("t", "ce-time", "not a time", "ce-specversion", "1.0", []byte{0xff})
	f.Add("t", "ce-specversion", "1.0", "ce-id", "a%20b", []byte(`{"tool_id": "echo", "parameters": {`))
	f.Add("_system", "x", "y", "z", "w", []byte(`{"specversion":"1.0","id":"s-2","data":"x","data_base64":"AA=="}`))
	f.Fuzz(func(t *testing.T, tenant, k1, v1, k2, v2 string, body []byte) {
		h := nats.Header{}
		h.Set(k1, v1)
		h.Set(k2, v2)
		inv, err := FromMessage("tool.invoke."+tenant, h, body, 1, time.Now())
		if inv == nil || inv.ID == "" {
			t.Fatal("no invocation id")
		}
		if err != nil {
			var te *api.Error
			if !errors.As(err, &te) || te.ECode == "" {
				t.Fatalf("uncoded error %v", err)
			}
		}
		if _, merr := json.Marshal(inv); merr != nil {
			t.Fatalf("decoded but cannot be encoded: %v", merr)
		}
		if subjects.CheckID(inv.ID) != nil {
			t.Fatalf("id %q cannot name a subject", inv.ID)
		}
		if inv.Tenant != subjects.SystemTenant && subjects.CheckTenant(inv.Tenant) != nil {
			t.Fatalf("tenant %q cannot name a subject", inv.Tenant)
		}
		if err == nil && (inv.Tenant == subjects.SystemTenant || !json.Valid(inv.Data) && len(inv.Data) > 0) {
			t.Fatalf("accepted %+v", inv)
		}
	})
}

func TestFromMessageRefusesNames(t *testing.T) {
	for name, c := range map[string]struct{ tenant, id string }{
		"long id":       {"acme", strings.Repeat(".", 1500)},
		"control id":    {"acme", "a\nb"},
		"long tenant":   {strings.Repeat("t", 4000), "x"},
		"system tenant": {"_system", "x"},
		"wildcard":      {"*", "x"},
	} {
		t.Run(name, func(t *testing.T) {
			h := binaryHeader()
			h.Set("ce-id", c.id)
			inv, err := FromMessage("tool.invoke."+c.tenant, h, []byte(reqJSON), 9, time.Now())
			if !errors.Is(err, api.NewError(api.InvalidParameters, api.EInvalidName, "")) {
				t.Fatalf("error %v", err)
			}
			if len(subjects.Result(inv.Tenant, inv.Agent(), inv.ID)) > 512 {
				t.Fatalf("subject of %d bytes", len(subjects.Result(inv.Tenant, inv.Agent(), inv.ID)))
			}
		})
	}
}

func TestFromMessageUnreadableKeepsID(t *testing.T) {
	for name, c := range map[string]struct {
		header nats.Header
		body   string
		id     string
	}{
		"broken binary":        {binaryHeader(), `{"tool_id": "echo", "parameters": {`, "inv-1"},
		"structured no header": {nil, `{"specversion":"1.0","id":"s-2","data":{}}`, "s-2"},
		"percent id":           {nats.Header{"ce-id": {"caf%C3%A9"}}, `x`, "café"},
	} {
		t.Run(name, func(t *testing.T) {
			inv, err := FromMessage("tool.invoke.acme", c.header, []byte(c.body), 3, time.Now())
			if err == nil || inv.ID != c.id {
				t.Fatalf("id %q, error %v", inv.ID, err)
			}
		})
	}
}

func TestHeaderEncodingRoundTrip(t *testing.T) {
	for _, v := range []string{"plain", "a b", "100%", "café", `q"x`, "a%20b"} {
		e := &api.Event{ID: "i", Source: "s", Type: EventType, Extensions: map[string]string{"x": v}}
		h, _, err := e.Binary()
		if err != nil {
			t.Fatal(err)
		}
		if got, err := decodeHeader(h["ce-x"][0]); err != nil || got != v {
			t.Fatalf("%q: got %q, %v", v, got, err)
		}
	}
}

// BenchmarkFromMessage is validate's decode of a binary-mode tool.invoke
// event, the ingest's common form.
func BenchmarkFromMessage(b *testing.B) {
	h, body, now := binaryHeader(), []byte(reqJSON), time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := FromMessage("tool.invoke.acme", h, body, 7, now); err != nil {
			b.Fatal(err)
		}
	}
}
