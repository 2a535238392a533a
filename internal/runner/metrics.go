package runner

import (
	"runtime"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/toolgate/toolgate/api"
)

// Metrics are the Prometheus series the Runner maintains: per stage, per
// finished invocation, and the build.
type Metrics struct {
	messages *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inflight *prometheus.GaugeVec
	// finished counts invocations audit finalised, by status and E-code
	// ("" on success), so an error rate is
	// sum(rate(toolgate_invocations_finished_total{status!="success"}[5m])) /
	// sum(rate(toolgate_invocations_finished_total[5m])).
	finished *prometheus.CounterVec
	// latency is received-to-finished time of those invocations.
	latency *prometheus.HistogramVec
	// swept counts the messages the sweep found left in a work queue, by
	// what it did: deleted (their invocation ended or moved on), ended
	// (stuck at the hop) or held (parked or running; counted per sweep).
	swept *prometheus.CounterVec
	// deleteFailures counts failed attempts to delete a message from a
	// work-queue stream (refused for want of the right, or timed out).
	deleteFailures *prometheus.CounterVec
	// inMemory counts the hand-offs a stage took as the invocation the
	// stage before it left in this process (Handed), not decoding them.
	inMemory *prometheus.CounterVec
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

// durationBuckets reach from sub-millisecond stage hops to tool runs of
// minutes (execute's duration includes the tool's runtime; timeouts are up
// to minutes).
var durationBuckets = []float64{
	0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800,
}

// NewMetrics registers the metrics on reg, with toolgate_build_info.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "toolgate", Subsystem: "stage", Name: "messages_total",
			Help: "Messages handled by a stage, by outcome.",
		}, []string{"stage", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "toolgate", Subsystem: "stage", Name: "duration_seconds",
			Help:    "Time from receiving a message to settling it, per stage.",
			Buckets: durationBuckets,
		}, []string{"stage"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "toolgate", Subsystem: "stage", Name: "in_flight",
			Help: "Messages a stage is processing now.",
		}, []string{"stage"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "toolgate", Subsystem: "invocations", Name: "finished_total",
			Help: "Invocations finalised by audit, by status and error E-code (empty on success); at least once.",
		}, []string{"status", "error_code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "toolgate", Subsystem: "invocation", Name: "duration_seconds",
			Help:    "Time from an invocation's arrival to its finalisation, by status.",
			Buckets: durationBuckets,
		}, []string{"status"}),
		swept: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "toolgate", Subsystem: "sweep", Name: "messages_total",
			Help: "Messages the sweep found left in a work queue, by stage and what it did (deleted, ended, held).",
		}, []string{"stage", "outcome"}),
		deleteFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "toolgate", Subsystem: "sweep", Name: "delete_failures_total",
			Help: "Failed attempts to delete a message from a work-queue stream, by stage and stream.",
		}, []string{"stage", "stream"}),
		inMemory: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "toolgate", Subsystem: "stage", Name: "handoffs_in_memory_total",
			Help: "Hand-offs a stage read as the invocation the stage before it left in the same process, without decoding them.",
		}, []string{"stage"}),
	}
	reg.MustRegister(m.messages, m.duration, m.inflight, m.finished, m.latency, m.swept, m.deleteFailures, m.inMemory, buildInfo())
	return m
}

// buildInfo is toolgate_build_info: always 1, labelled with the module
// version ("(devel)" for a local build) and the Go version.
func buildInfo() prometheus.Collector {
	version := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		version = bi.Main.Version
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "toolgate", Name: "build_info",
		Help:        "Always 1; the labels name the toolgate build.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
	})
	g.Set(1)
	return g
}

// ending is what the metrics read of an invocation a stage has settled.
type ending struct {
	status   api.Status
	ecode    string // its error's, if it failed
	received time.Time
}

// stageSeries are a stage's series that every message it settles
// updates, looked up once (by Run): a lookup hashes its labels, on every
// hop.
type stageSeries struct {
	duration prometheus.Observer
	// messages by the outcomes of a call's hops; the others are rare.
	forwarded, ended, finished prometheus.Counter
}

func (m *Metrics) seriesOf(stage string) *stageSeries {
	return &stageSeries{
		duration:  m.duration.WithLabelValues(stage),
		forwarded: m.messages.WithLabelValues(stage, outcomeForwarded),
		ended:     m.messages.WithLabelValues(stage, outcomeEnded),
		finished:  m.messages.WithLabelValues(stage, outcomeFinished),
	}
}

// observe records one settled message of stage, whose series s are (nil:
// looked up), and, when audit finalised it, the invocation's outcome.
func (m *Metrics) observe(s *stageSeries, stage, outcome string, end ending, took, sinceReceived time.Duration) {
	if s == nil {
		s = &stageSeries{duration: m.duration.WithLabelValues(stage)}
	}
	var c prometheus.Counter
	switch outcome {
	case outcomeForwarded:
		c = s.forwarded
	case outcomeEnded:
		c = s.ended
	case outcomeFinished:
		c = s.finished
	}
	if c == nil {
		c = m.messages.WithLabelValues(stage, outcome)
	}
	c.Inc()
	s.duration.Observe(took.Seconds())
	if outcome != outcomeFinished || !end.status.Terminal() {
		return
	}
	m.finished.WithLabelValues(string(end.status), end.ecode).Inc()
	if !end.received.IsZero() && sinceReceived >= 0 {
		m.latency.WithLabelValues(string(end.status)).Observe(sinceReceived.Seconds())
	}
}
