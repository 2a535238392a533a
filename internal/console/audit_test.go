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
		if !json.Valid(e.Raw) {
			t.Fatalf("raw event is not JSON: %q", e.Raw)
		}
		var in struct {
			Data struct {
				Parameters map[string]any `json:"parameters"`
			} `json:"data"`
		}
		if json.Unmarshal(data, &in) == nil && in.Data.Parameters["password"] == "hunter2" && strings.Contains(string(e.Raw), "hunter2") {
			t.Fatalf("a password survived: %s", e.Raw)
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
