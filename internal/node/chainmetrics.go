package node

import "github.com/prometheus/client_golang/prometheus"

// AuditChainMetrics counts the audit events the chain's checkpoints cover
// (docs/audit.md): from the leaves handed over as audit's publishes were
// acknowledged, or read back from the stream.
type AuditChainMetrics struct {
	events *prometheus.CounterVec
}

// NewAuditChainMetrics registers the series on reg.
func NewAuditChainMetrics(reg prometheus.Registerer) *AuditChainMetrics {
	m := &AuditChainMetrics{events: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "toolgate", Subsystem: "audit_chain", Name: "events_total",
		Help: "Audit events covered by the checkpoints this process made, by where their leaves came from: ack (hashed as audit's publish was acknowledged) or read (read back from AUDIT).",
	}, []string{"leaf"})}
	reg.MustRegister(m.events)
	return m
}

func (m *AuditChainMetrics) counted(fromAcks, readBack uint64) {
	if m == nil {
		return
	}
	m.events.WithLabelValues("ack").Add(float64(fromAcks))
	m.events.WithLabelValues("read").Add(float64(readBack))
}
