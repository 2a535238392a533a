package modeltool

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/modelrouter"
)

// Stats are the model router's Prometheus series (seed 000 §2.8,
// UPDATE_MODEL_STATS): per model, calls by outcome (the success rate is
// calls{outcome="success"} over all), call latency, tokens and cost.
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
		}, []string{"model", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "toolgate", Subsystem: "model", Name: "call_seconds",
			Help:    "Time of one call to one endpoint of a model.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120},
		}, []string{"model"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "toolgate", Subsystem: "model", Name: "tokens_total",
			Help: "Tokens used, by direction (input or output).",
		}, []string{"model", "direction"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "toolgate", Subsystem: "model", Name: "cost_total",
			Help: "Cost of the tokens used, at the catalogue's prices.",
		}, []string{"model"}),
	}
	reg.MustRegister(s.calls, s.latency, s.tokens, s.cost)
	return s
}

func (s *Stats) observe(m *modelrouter.Model, err error, took time.Duration, a modelrouter.Answer) {
	if s == nil {
		return
	}
	outcome := "success"
	if err != nil {
		outcome = api.AsError(err).ECode
	}
	s.calls.WithLabelValues(m.Name, outcome).Inc()
	s.latency.WithLabelValues(m.Name).Observe(took.Seconds())
	s.tokens.WithLabelValues(m.Name, "input").Add(float64(a.InputTokens))
	s.tokens.WithLabelValues(m.Name, "output").Add(float64(a.OutputTokens))
	s.cost.WithLabelValues(m.Name).Add(m.Price.Cost(a.InputTokens, a.OutputTokens))
}
