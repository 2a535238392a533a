package modeltool

import (
	"bytes"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/modelrouter"
)

// TestStatsSummary: what a worker exports is what models stats reports.
func TestStatsSummary(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := NewStats(reg)
	m := &modelrouter.Model{Name: "m", Price: modelrouter.Price{InputPer1K: 1, OutputPer1K: 2}}
	s.observe(m, nil, 2*time.Second, modelrouter.Answer{InputTokens: 1000, OutputTokens: 500})
	s.observe(m, nil, 4*time.Second, modelrouter.Answer{InputTokens: 1000, OutputTokens: 500})
	s.observe(m, api.NewError(api.RateLimitExceeded, api.ERateLimited, "429"), 0, modelrouter.Answer{})
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range fams {
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
	}
	out, err := Summarise(&buf)
	if err != nil || len(out) != 1 {
		t.Fatalf("%+v %v", out, err)
	}
	got := out[0]
	if got.Calls != 3 || got.SuccessRate != 2.0/3 || got.MeanLatency != 2 || got.InputTokens != 2000 ||
		got.OutputTokens != 1000 || got.Cost != 4 || got.Failures[api.ERateLimited] != 1 {
		t.Fatalf("%+v", got)
	}
}
