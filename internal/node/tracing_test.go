package node_test

import (
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is a minimal OTLP/HTTP collector: it keeps the resource spans
// of every POST /v1/traces.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.ResourceSpans
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.NotFound(w, req)
		return
	}
	body, _ := io.ReadAll(req.Body)
	var msg coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.spans = append(r.spans, msg.ResourceSpans...)
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// inTrace returns the span names in traceID and the resource attributes
// they were exported with.
func (r *otlpReceiver) inTrace(traceID string) (map[string]bool, map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	names, attrs := map[string]bool{}, map[string]string{}
	for _, rs := range r.spans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				if strings.EqualFold(hexID(s.TraceId), traceID) {
					names[s.Name] = true
					for _, kv := range rs.GetResource().GetAttributes() {
						attrs[kv.Key] = kv.Value.GetStringValue()
					}
				}
			}
		}
	}
	return names, attrs
}

func hexID(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// TestOTLPFromEnvironment: the standard OTel variables configure export (a
// URL endpoint over TLS with its CA file, service name, resource
// attributes); an invocation carrying a plain traceparent header is traced
// in the caller's trace, and its audit and result events carry the caller's
// context unchanged.
func TestOTLPFromEnvironment(t *testing.T) {
	recv := &otlpReceiver{}
	srv := httptest.NewTLSServer(recv)
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	pemCert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(ca, pemCert, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", ca)
	t.Setenv("OTEL_SERVICE_NAME", "toolgate-under-test")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci,team=tools")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })

	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{OTLPEndpoint: os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")})

	const caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	body, err := json.Marshal(request("otel", "echo", `{"message":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	h := nats.Header{}
	h.Set("ce-specversion", "1.0")
	h.Set("ce-id", "otel-1")
	h.Set("ce-source", "urn:test")
	h.Set("ce-type", envelope.EventType)
	h.Set("content-type", "application/json")
	h.Set("traceparent", caller) // as an OpenTelemetry propagator writes it
	h.Set("tracestate", "vendor=1")
	if resp := e.publishRaw("tool.invoke.otel", h, body); resp.Status != api.StatusSuccess {
		t.Fatalf("status %s: %+v", resp.Status, resp.Error)
	}

	res := e.read(subjects.StreamResults, subjects.ResultTenant("otel"), 1, 10*time.Second)[0]
	var result struct {
		TraceParent string `json:"traceparent"`
		TraceState  string `json:"tracestate"`
	}
	if err := json.Unmarshal(res.Data(), &result); err != nil {
		t.Fatal(err)
	}
	if result.TraceParent != caller || result.TraceState != "vendor=1" {
		t.Errorf("result event traceparent %q tracestate %q: want the caller's %q", result.TraceParent, result.TraceState, caller)
	}
	for _, ev := range e.auditOf("otel", 2) {
		if tp, _ := ev.Extensions()["traceparent"].(string); tp != caller {
			t.Errorf("audit event %s has traceparent %q: want the caller's %q", ev.Type(), tp, caller)
		}
	}

	var attrs map[string]string
	eventually(t, 15*time.Second, "a span from every stage at the receiver", func() bool {
		var names map[string]bool
		names, attrs = recv.inTrace(traceID)
		return len(names) >= len(subjects.Stages)
	})
	want := map[string]string{"service.name": "toolgate-under-test", "deployment.environment": "ci", "team": "tools"}
	for k, v := range want {
		if attrs[k] != v {
			t.Errorf("resource attribute %s = %q, want %q (all: %v)", k, attrs[k], v, attrs)
		}
	}
}
