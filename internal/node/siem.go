package node

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/toolgate/toolgate/internal/auditotlp"
)

// AuditOTLPMetrics counts the audit events sent to a SIEM over OTLP.
type AuditOTLPMetrics struct {
	exported prometheus.Counter
	failures prometheus.Counter
}

// NewAuditOTLPMetrics registers the series on reg.
func NewAuditOTLPMetrics(reg prometheus.Registerer) *AuditOTLPMetrics {
	m := &AuditOTLPMetrics{
		exported: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "toolgate", Subsystem: "audit_otlp", Name: "events_total",
			Help: "Audit events the OTLP collector took (serve --audit-otlp)."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "toolgate", Subsystem: "audit_otlp", Name: "failures_total",
			Help: "Batches of audit events the OTLP collector did not take; they stay in AUDIT and are sent again."}),
	}
	reg.MustRegister(m.exported, m.failures)
	return m
}

// startAuditOTLP sends AUDIT to c.AuditOTLP, as audit, until the stages stop.
func (n *Node) startAuditOTLP(ctx context.Context, c StageConfig) error {
	if c.AuditOTLP == "" {
		return nil
	}
	if _, err := auditotlp.Options(c.AuditOTLP); err != nil {
		return err
	}
	m := c.AuditOTLPMetrics
	x := &auditotlp.Exporter{JS: n.JS, Endpoint: c.AuditOTLP, Log: n.Log}
	if m != nil {
		x.Exported = func(k int) { m.exported.Add(float64(k)) }
		x.Failed = func(error) { m.failures.Inc() }
	}
	cctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := x.Run(cctx); err != nil {
			n.Log.Error("audit events are not sent over OTLP", "err", err)
		}
	}()
	n.onStop(func() { stop(); <-done })
	return nil
}
