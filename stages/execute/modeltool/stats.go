package modeltool

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

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

// ModelStats summarises one model's series.
type ModelStats struct {
	Model        string  `json:"model"`
	Calls        float64 `json:"calls"`
	SuccessRate  float64 `json:"success_rate"`
	MeanLatency  float64 `json:"mean_latency_seconds"`
	InputTokens  float64 `json:"input_tokens"`
	OutputTokens float64 `json:"output_tokens"`
	Cost         float64 `json:"cost"`
	// Failures counts failed calls by E-code.
	Failures map[string]float64 `json:"failures,omitempty"`
}

// Summarise reads a worker's metrics in the Prometheus text format and
// summarises the model series per model, sorted by name.
func Summarise(r io.Reader) ([]ModelStats, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("reading metrics: %w", err)
	}
	by := map[string]*ModelStats{}
	get := func(m *dto.Metric) *ModelStats {
		name := label(m, "model")
		if by[name] == nil {
			by[name] = &ModelStats{Model: name}
		}
		return by[name]
	}
	var success = map[string]float64{}
	for _, m := range fams["toolgate_model_calls_total"].GetMetric() {
		s, v := get(m), m.GetCounter().GetValue()
		s.Calls += v
		if o := label(m, "outcome"); o == "success" {
			success[s.Model] += v
		} else {
			if s.Failures == nil {
				s.Failures = map[string]float64{}
			}
			s.Failures[o] += v
		}
	}
	for _, m := range fams["toolgate_model_call_seconds"].GetMetric() {
		if h := m.GetHistogram(); h.GetSampleCount() > 0 {
			get(m).MeanLatency = h.GetSampleSum() / float64(h.GetSampleCount())
		}
	}
	for _, m := range fams["toolgate_model_tokens_total"].GetMetric() {
		if label(m, "direction") == "input" {
			get(m).InputTokens += m.GetCounter().GetValue()
		} else {
			get(m).OutputTokens += m.GetCounter().GetValue()
		}
	}
	for _, m := range fams["toolgate_model_cost_total"].GetMetric() {
		get(m).Cost += m.GetCounter().GetValue()
	}
	out := make([]ModelStats, 0, len(by))
	for _, s := range by {
		if s.Calls > 0 {
			s.SuccessRate = success[s.Model] / s.Calls
		}
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b ModelStats) int { return strings.Compare(a.Model, b.Model) })
	return out, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
