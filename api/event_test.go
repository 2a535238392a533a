package api

import (
	"testing"
	"time"
)

func TestEventBinary(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600))
	e := &Event{ID: "i-1", Source: "urn:s", Type: TypeInvoke, Time: at, DataContentType: "application/json",
		Extensions: map[string]string{"traceparent": "00-a-b-01", "note": "a b%"}, Data: []byte(`{}`)}
	h, body, err := e.Binary()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"ce-specversion": "1.0", "ce-id": "i-1", "ce-source": "urn:s", "ce-type": "tool.invoke",
		"ce-time": "2026-01-02T02:04:05.000000006Z", "ce-traceparent": "00-a-b-01", "ce-note": "a%20b%25",
		"content-type": "application/json", MsgIDHeader: MsgID("urn:s", "i-1"),
	}
	for k, v := range want {
		if got := h[k]; len(got) != 1 || got[0] != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if _, ok := h["ce-subject"]; ok {
		t.Error("empty subject sent")
	}
	if string(body) != `{}` {
		t.Errorf("body %s", body)
	}
	if _, _, err := (&Event{ID: "i"}).Binary(); err == nil {
		t.Error("event without source and type encoded")
	}
}

func TestDecodeStructured(t *testing.T) {
	cases := []struct {
		name, in, data string
		ext            map[string]string
		bad            bool
	}{
		{name: "json data", in: `{"specversion":"1.0","id":"1","source":"s","type":"tool.result","data":{"a":1},"tenantid":"acme"}`,
			data: `{"a":1}`, ext: map[string]string{"tenantid": "acme"}},
		{name: "base64 data", in: `{"specversion":"1.0","id":"1","source":"s","type":"t","data_base64":"eyJhIjoxfQ=="}`, data: `{"a":1}`},
		{name: "no data", in: `{"specversion":"1.0","id":"1","source":"s","type":"t"}`},
		{name: "not an event", in: `{"id":"1"}`, bad: true},
		{name: "not json", in: `nope`, bad: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, err := DecodeStructured([]byte(c.in))
			if c.bad {
				if err == nil {
					t.Fatal("decoded")
				}
				return
			}
			if err != nil || string(e.Data) != c.data || e.ID != "1" {
				t.Fatalf("got %+v, %v", e, err)
			}
			for k, v := range c.ext {
				if e.Extensions[k] != v {
					t.Errorf("extension %s = %q", k, e.Extensions[k])
				}
			}
		})
	}
}
