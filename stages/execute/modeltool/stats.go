package modeltool

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/modelrouter"
)

// Stats are the model router's Prometheus series: per model and task type, calls by outcome (the
// success rate is calls{outcome="success"} over all), call latency, tokens
// and cost. They are this process's; the cluster-wide statistics routing
// uses are in KV (Recorder).
type Stats struct {
	calls   *prometheus.CounterVec
	latency *prometheus.HistogramVec
	tokens  *prometheus.CounterVec
	cost    *prometheus.CounterVec
}

// NewStats registers the series on reg.
func NewStats(reg prometheus.Registerer) *Stats {
	s := &Stats{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "toolgate", Subsystem: "model", Name: "calls_total",
			Help: "Calls to a model's endpoints, by outcome (success or the E-code).",
		}, []string{"model", "task_type", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "toolgate", Subsystem: "model", Name: "call_seconds",
			Help:    "Time of one call to one endpoint of a model.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120},
		}, []string{"model", "task_type"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "toolgate", Subsystem: "model", Name: "tokens_total",
			Help: "Tokens used, by direction (input or output).",
		}, []string{"model", "task_type", "direction"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "toolgate", Subsystem: "model", Name: "cost_total",
			Help: "Cost of the tokens used, at the catalogue's prices.",
		}, []string{"model", "task_type"}),
	}
	reg.MustRegister(s.calls, s.latency, s.tokens, s.cost)
	return s
}

func (s *Stats) observe(m *modelrouter.Model, taskType string, err error, took time.Duration, a modelrouter.Answer) {
	if s == nil {
		return
	}
	outcome := "success"
	if err != nil {
		outcome = api.AsError(err).ECode
	}
	s.calls.WithLabelValues(m.Name, taskType, outcome).Inc()
	s.latency.WithLabelValues(m.Name, taskType).Observe(took.Seconds())
	s.tokens.WithLabelValues(m.Name, taskType, "input").Add(float64(a.InputTokens))
	s.tokens.WithLabelValues(m.Name, taskType, "output").Add(float64(a.OutputTokens))
	s.cost.WithLabelValues(m.Name, taskType).Add(m.Price.Cost(a.InputTokens, a.OutputTokens))
}

// Recorder keeps the cluster-wide model statistics in KV
// (*kvstore.ModelStatsRecorder). Record must only add in memory: it is
// called on the call path.
type Recorder interface {
	Record(model, taskType string, o modelrouter.Outcome)
}

// Observer returns, for a call's task type, what the cluster has recently
// seen of each model's calls ((*kvstore.ModelStatsView).Observer). It
// must answer from memory.
type Observer func(taskType string) func(model string) (modelrouter.Observed, bool)

// TaskTypeNone and TaskTypeOther are the task types statistics use for a
// call that names none and for one that names a type the routing rules
// do not score (so callers cannot grow the series without bound).
const (
	TaskTypeNone  = "none"
	TaskTypeOther = "other"
)

// taskType is the task type a call is counted under.
func (k *Kind) taskType(t string) string {
	switch _, known := k.rules.TaskScores[t]; {
	case t == "":
		return TaskTypeNone
	case known:
		return t
	}
	return TaskTypeOther
}

// record counts one call to one endpoint, in Prometheus and in KV. The
// execute stage records, not audit: it sees every call to every endpoint,
// those of fallback attempts, of retries and of summaries included, with
// each one's own latency, tokens and outcome, as it ends, while audit sees
// one summary per invocation. A call the invocation's cancellation cut
// short says nothing about the model and is not counted in KV.
func (k *Kind) record(ctx context.Context, m *modelrouter.Model, taskType string, err error, took time.Duration, a modelrouter.Answer) {
	k.cfg.Stats.observe(m, taskType, err, took, a)
	if k.cfg.Recorder == nil || errors.Is(ctx.Err(), context.Canceled) {
		return
	}
	k.cfg.Recorder.Record(m.Name, taskType, modelrouter.Outcome{Failure: modelrouter.FailureClass(err), LatencyMS: took.Milliseconds(),
		InputTokens: a.InputTokens, OutputTokens: a.OutputTokens, Cost: m.Price.Cost(a.InputTokens, a.OutputTokens)})
}
