package stages

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the per-stage Prometheus series the Runner maintains.
type Metrics struct {
	messages *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inflight *prometheus.GaugeVec
}

// Outcome labels of toolgate_stage_messages_total.
const (
	outcomeForwarded    = "forwarded"     // passed to the next stage
	outcomeEnded        = "ended"         // the invocation ended here and went to audit
	outcomeFinished     = "finished"      // audit finalised it
	outcomeParked       = "parked"        // waiting for a human's approval
	outcomeRetried      = "retried"       // transient failure, redelivery scheduled
	outcomeTerminated   = "terminated"    // redelivery stopped
	outcomePoison       = "poison"        // undecodable message
	outcomePublishError = "publish_error" // could not hand on; redelivery scheduled
)

// NewMetrics registers the stage metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "toolgate", Subsystem: "stage", Name: "messages_total",
			Help: "Messages handled by a stage, by outcome.",
		}, []string{"stage", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "toolgate", Subsystem: "stage", Name: "duration_seconds",
			Help:    "Time from receiving a message to settling it, per stage.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}, []string{"stage"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "toolgate", Subsystem: "stage", Name: "in_flight",
			Help: "Messages a stage is processing now.",
		}, []string{"stage"}),
	}
	reg.MustRegister(m.messages, m.duration, m.inflight)
	return m
}
