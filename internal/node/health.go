package node

import (
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Health is what a process reports on its metrics address besides /metrics:
//
//   - /healthz answers 200 while the process serves HTTP at all (liveness:
//     a process waiting for its server or topology is alive, not stuck);
//   - /readyz answers 200 once the streams, consumers and buckets exist and
//     the stages run (Run calls SetReady), and only while the NATS connection
//     is up and every stage takes work (runner.Runner.Stalled: a stage
//     that has neither pulled nor settled a message for a minute is not);
//     otherwise 503 with the reason as the body.
//
// Kubernetes probes and load balancers use them; see docs/operations.md.
type Health struct {
	ready  atomic.Bool
	conn   atomic.Pointer[nats.Conn]
	stages atomic.Pointer[[]func() string]
}

// Watch adds checks that report why a stage takes no work ("" while it
// does); /readyz fails while any of them reports.
func (h *Health) Watch(checks ...func() string) {
	var all []func() string
	if p := h.stages.Load(); p != nil {
		all = append(all, *p...)
	}
	all = append(all, checks...)
	h.stages.Store(&all)
}

// SetReady records that the topology is there and the stages run over nc.
func (h *Health) SetReady(nc *nats.Conn) {
	h.conn.Store(nc)
	h.ready.Store(true)
}

// NotReady reports why the process is not ready, or "" when it is.
func (h *Health) NotReady() string {
	if !h.ready.Load() {
		return "waiting for the NATS server and toolgate's streams and consumers"
	}
	if nc := h.conn.Load(); nc == nil || !nc.IsConnected() {
		status := "no connection"
		if nc != nil {
			status = nc.Status().String()
		}
		return fmt.Sprintf("NATS connection not up (%s)", status)
	}
	if p := h.stages.Load(); p != nil {
		for _, check := range *p {
			if why := check(); why != "" {
				return why
			}
		}
	}
	return ""
}

// Handler serves /metrics from reg, /healthz and /readyz.
func (h *Health) Handler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := h.NotReady(); why != "" {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprintln(w, "ready")
	})
	return mux
}
