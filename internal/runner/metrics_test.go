package runner

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/toolgate/toolgate/api"
)

// TestObserveSeries: a stage's settled messages count under their own
// outcome whether its series were looked up once (Run) or are looked up
// on each message, the rare outcomes included.
func TestObserveSeries(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	s := m.seriesOf("route")
	for _, o := range []string{outcomeForwarded, outcomeForwarded, outcomeEnded, outcomeRetried} {
		m.observe(s, "route", o, ending{}, time.Millisecond, 0)
	}
	m.observe(nil, "route", outcomeForwarded, ending{}, time.Millisecond, 0)
	m.observe(m.seriesOf("audit"), "audit", outcomeFinished, ending{status: api.StatusSuccess, received: time.Now()}, time.Millisecond, time.Second)
	for outcome, want := range map[string]float64{outcomeForwarded: 3, outcomeEnded: 1, outcomeRetried: 1, outcomeFinished: 0} {
		if got := testutil.ToFloat64(m.messages.WithLabelValues("route", outcome)); got != want {
			t.Errorf("route %s: %v messages, want %v", outcome, got, want)
		}
	}
	if got := testutil.CollectAndCount(m.duration); got != 2 {
		t.Errorf("%d duration series, want route's and audit's", got)
	}
	if got := testutil.ToFloat64(m.finished.WithLabelValues(string(api.StatusSuccess), "")); got != 1 {
		t.Errorf("%v invocations finished, want 1", got)
	}
}

// BenchmarkObserve is the metrics of one settled hop, its stage's series
// looked up on every message and once.
func BenchmarkObserve(b *testing.B) {
	m := NewMetrics(prometheus.NewRegistry())
	for name, s := range map[string]*stageSeries{"lookup": nil, "once": m.seriesOf("route")} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m.observe(s, "route", outcomeForwarded, ending{}, time.Millisecond, 0)
			}
		})
	}
}
