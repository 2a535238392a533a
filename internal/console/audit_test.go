package console

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzParseEvent: whatever arrives on an audit subject, reading it never
// panics, the kept raw event is JSON, and a credential under parameters
// never survives into it.
func FuzzParseEvent(f *testing.F) {
	f.Add("audit.demo.tool.succeeded", []byte(`{"type":"ai.agent.tool.succeeded","time":"2026-01-02T03:04:05Z","data":{"tenant_id":"demo","invocation_id":"i1","tool_id":"echo","tool_version":"1.0.0","status":"success","parameters":{"password":"hunter2"}}}`))
	f.Add("audit.demo.tool.failed", []byte(`{"data":{"error":{"code":"x","ecode":"E1"},"parameters":"<script>"}}`))
	f.Add("audit", []byte(`not json`))
	f.Add("audit.x.y", []byte(`{"data":[1,2]}`))
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		e := parseEvent(subject, data)
		if !json.Valid(e.Raw()) {
			t.Fatalf("raw event is not JSON: %q", e.Raw())
		}
		var in struct {
			Data struct {
				Parameters map[string]any `json:"parameters"`
			} `json:"data"`
		}
		if json.Unmarshal(data, &in) == nil && in.Data.Parameters["password"] == "hunter2" && strings.Contains(string(e.Raw()), "hunter2") {
			t.Fatalf("a password survived: %s", e.Raw())
		}
	})
}

// TestFilter: every field given must match; text searches the raw event.
func TestFilter(t *testing.T) {
	e := parseEvent("audit.demo.tool.succeeded", []byte(`{"data":{"tenant_id":"demo","invocation_id":"inv-42","tool_id":"echo","tool_version":"1.0.0","status":"success","parameters":{"city":"Lyon"}}}`))
	for _, tc := range []struct {
		f    Filter
		want bool
	}{
		{Filter{}, true},
		{Filter{Tenant: "demo", Type: "succeeded", Tool: "echo", Status: "success", Text: "lyon"}, true},
		{Filter{Tenant: "other"}, false},
		{Filter{Type: "failed"}, false},
		{Filter{Tool: "pay"}, false},
		{Filter{Status: "error"}, false},
		{Filter{Text: "Paris"}, false},
	} {
		if got := tc.f.match(e); got != tc.want {
			t.Errorf("%+v matched %v, want %v", tc.f, got, tc.want)
		}
	}
}

// TestLoopback: only addresses on this machine count as loopback.
func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "[::1]:8080": true, "localhost:1": true,
		"0.0.0.0:8080": false, ":8080": false, "192.0.2.1:80": false, "example.com:80": false, "nonsense": false,
	} {
		if got := Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

// BenchmarkIngest is the console's cost per audit event: reading it,
// redacting it again, keeping it and handing it to one live view. Its
// events/s set against the pipeline's saturation rate (make bench; two to
// four audit events a call) says whether a console keeps up.
func BenchmarkIngest(b *testing.B) {
	data := []byte(`{"specversion":"1.0","id":"inv-1:tool.succeeded","source":"urn:toolgate:audit","type":"ai.agent.tool.succeeded","time":"2026-01-02T03:04:05.123Z","tenantid":"demo","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","data":{"invocation_id":"inv-1","tenant_id":"demo","agent_did":"did:agent:demo","tool_id":"echo","tool_version":"1.0.0","status":"success","stage":"audit","parameters":{"message":"hello from the benchmark, nothing secret here","count":3},"result":{"bytes":52,"sha256":"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},"execution_metadata":{"duration_ms":3,"stages":[{"stage":"validate","duration_us":900},{"stage":"authorize","duration_us":1200}]},"event_source":"urn:toolgate:client","ingest_seq":42}}`)
	h := newHub(5000)
	c, done := h.subscribe()
	defer done()
	go func() {
		for range c {
		}
	}()
	b.ReportAllocs()
	b.ResetTimer()
	var seq uint64
	for b.Loop() {
		seq++
		e := parseEvent("audit.demo.tool.succeeded", data)
		e.Seq = seq
		h.add(e)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// TestHubWindow: the hub keeps the last size events, oldest first, and
// forgets the ones before.
func TestHubWindow(t *testing.T) {
	h := newHub(10)
	for i := range 25 {
		h.add(Event{Seq: uint64(i + 1), Type: "tool.succeeded", InvocationID: string(rune('a' + i))})
	}
	got := h.recent(Filter{}, 100)
	if len(got) != 10 || got[0].Seq != 16 || got[9].Seq != 25 {
		t.Fatalf("kept %d events, %d..%d; want 16..25", len(got), got[0].Seq, got[len(got)-1].Seq)
	}
	if _, ok := h.get(15); ok {
		t.Fatal("an event before the window is still found")
	}
	if e, ok := h.get(16); !ok || e.InvocationID != "p" {
		t.Fatalf("event 16: %+v %v", e, ok)
	}
	if n := len(h.recent(Filter{}, 3)); n != 3 {
		t.Fatalf("recent(3) gave %d", n)
	}
}
