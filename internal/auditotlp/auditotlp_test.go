package auditotlp_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/auditotlp"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
)

// collector is an OTLP/HTTP receiver decoding with the collector's own
// library; down makes it answer 503, as a collector that is overloaded or
// restarting does.
type collector struct {
	mu       sync.Mutex
	got      map[string]map[string]string // event id: attributes, and trace and body
	requests int
	down     atomic.Bool
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/logs" {
		http.NotFound(w, r)
		return
	}
	if c.down.Load() {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	b, _ := io.ReadAll(r.Body)
	req := plogotlp.NewExportRequest()
	if err := req.UnmarshalProto(b); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requests++
	rls := req.Logs().ResourceLogs()
	for i := range rls.Len() {
		rl := rls.At(i)
		svc, _ := rl.Resource().Attributes().Get("service.name")
		for j := range rl.ScopeLogs().Len() {
			lrs := rl.ScopeLogs().At(j).LogRecords()
			for k := range lrs.Len() {
				lr := lrs.At(k)
				m := map[string]string{"service": svc.AsString(), "trace": lr.TraceID().String(), "span": lr.SpanID().String(),
					"body": lr.Body().AsString(), "event_name": lr.EventName(), "severity": lr.SeverityNumber().String()}
				lr.Attributes().Range(func(k string, v pcommon.Value) bool { m[k] = v.AsString(); return true })
				id := m[auditotlp.AttrID]
				if _, dup := c.got[id]; !dup {
					c.got[id] = m
				}
			}
		}
	}
	resp := plogotlp.NewExportResponse()
	out, _ := resp.MarshalProto()
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (c *collector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.got)
}

func TestAuditEventsReachACollectorAndNoneIsLostWhileItIsDown(t *testing.T) {
	_, js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := topology.EnsureTopology(ctx, js, topology.TopologyOptions{}); err != nil {
		t.Fatal(err)
	}
	col := &collector{got: map[string]map[string]string{}}
	srv := httptest.NewServer(col)
	defer srv.Close()
	const trace, span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	publish := func(i int, status string) {
		t.Helper()
		data := fmt.Sprintf(`{"specversion":"1.0","id":"inv-%d:tool.%s","source":"urn:toolgate:audit","type":"ai.agent.tool.%s","time":"2026-11-29T00:00:00Z","tenantid":"acme","traceparent":"00-%s-%s-01","datacontenttype":"application/json","data":{"invocation_id":"inv-%d","tenant_id":"acme","tool_id":"echo","status":"%s","parameters":{"message":"[REDACTED]"}}}`,
			i, status, status, trace, span, i, status)
		if _, err := js.Publish(ctx, subjects.AuditEvent("acme", "tool."+status), []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		publish(i, "succeeded")
	}
	var failed atomic.Int32
	x := &auditotlp.Exporter{JS: js, Endpoint: srv.URL, Log: slog.New(slog.DiscardHandler), Batch: 7,
		Failed: func(error) { failed.Add(1) }}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = x.Run(rctx) }()
	natstest.Eventually(t, 30*time.Second, func() bool { return col.count() == 20 }, "20 events at the collector")

	col.mu.Lock()
	r := col.got["inv-3:tool.succeeded"]
	col.mu.Unlock()
	for k, want := range map[string]string{auditotlp.AttrTenant: "acme", auditotlp.AttrType: "ai.agent.tool.succeeded",
		auditotlp.AttrTool: "echo", auditotlp.AttrOutcome: "succeeded", "trace": trace, "span": span, "service": "toolgate",
		"event_name": "ai.agent.tool.succeeded"} {
		if r[k] != want {
			t.Errorf("%s = %q, want %q (record %v)", k, r[k], want, r)
		}
	}
	if want := `"message":"[REDACTED]"`; !strings.Contains(r["body"], want) {
		t.Errorf("body %q: want the event as stored", r["body"])
	}

	// The collector down: events wait in AUDIT, unacknowledged; the
	// export is retried and, the collector back, every one arrives.
	col.down.Store(true)
	for i := 20; i < 50; i++ {
		publish(i, "failed")
	}
	natstest.Eventually(t, 30*time.Second, func() bool { return failed.Load() >= 1 }, "a failed export")
	if n := col.count(); n != 20 {
		t.Fatalf("%d events while the collector was down", n)
	}
	// The exporter stopped meanwhile: it resumes where it stopped.
	rcancel()
	<-done
	col.down.Store(false)
	rctx, rcancel = context.WithCancel(ctx)
	defer rcancel()
	done = make(chan struct{})
	go func() { defer close(done); _ = x.Run(rctx) }()
	natstest.Eventually(t, 60*time.Second, func() bool { return col.count() == 50 }, "all 50 events at the collector")
	col.mu.Lock()
	for i := range 50 {
		status := "succeeded"
		if i >= 20 {
			status = "failed"
		}
		if _, ok := col.got[fmt.Sprintf("inv-%d:tool.%s", i, status)]; !ok {
			t.Errorf("event %d missing", i)
		}
	}
	if got := col.got["inv-30:tool.failed"][auditotlp.AttrOutcome]; got != "failed" {
		t.Errorf("outcome %q", got)
	}
	col.mu.Unlock()
	rcancel()
	<-done
}
