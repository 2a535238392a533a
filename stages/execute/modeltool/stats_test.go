package modeltool

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/toolgate/toolgate/internal/modelrouter"
	"github.com/toolgate/toolgate/internal/modelrouter/modeltest"
)

// recorded is a Recorder that keeps what it is given.
type recorded struct {
	mu  sync.Mutex
	got []string // model/task type/failure class
	out []modelrouter.Outcome
}

func (r *recorded) Record(model, taskType string, o modelrouter.Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, model+"/"+taskType+"/"+o.Failure)
	r.out = append(r.out, o)
}

// TestCallsAreRecorded: every call to every endpoint, fallback attempts
// included, is recorded once with its model, task type (unknown types
// folded into "other"), failure class, tokens and cost, in KV's recorder
// and in the Prometheus series; and what is observed reaches routing.
func TestCallsAreRecorded(t *testing.T) {
	ok := modeltest.New(t, modelrouter.OpenAI)
	failing := modeltest.New(t, modelrouter.OpenAI)
	failing.Set(modeltest.Fail500)
	limited := modeltest.New(t, modelrouter.OpenAI)
	limited.Set(modeltest.Limited)
	k := newKind(
		entry(t, fmt.Sprintf(`{"name":"cheap","api":"openai","endpoints":[%q,%q],"tier":"small","context_window":4000,
		  "price":{"input_per_1k":0.1,"output_per_1k":0.1},"fallback":["good"],"retry":{"max_attempts":1}}`, failing.Base(), limited.Base())),
		entry(t, fmt.Sprintf(`{"name":"good","api":"openai","endpoints":[%q],"tier":"small","context_window":4000,
		  "price":{"input_per_1k":1,"output_per_1k":2}}`, ok.Base())))
	rec := &recorded{}
	reg := prometheus.NewRegistry()
	k.cfg.Stats, k.cfg.Recorder = NewStats(reg), rec
	inv := invocation([]string{"127.0.0.1"})
	if _, _, err := run(t, k, inv, t.Context(), `{"prompt":"hi","task":{"type":"coding"}}`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := run(t, k, inv, t.Context(), `{"prompt":"hi","task":{"type":"made-up"}}`); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"cheap/coding/server_error": 1, "cheap/coding/rate_limited": 1, "good/coding/": 1,
		"cheap/other/server_error": 1, "cheap/other/rate_limited": 1, "good/other/": 1}
	got := map[string]int{}
	for _, g := range rec.got {
		got[g]++
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("recorded %v, want %v", got, want)
	}
	for i, g := range rec.got {
		if o := rec.out[i]; strings.HasPrefix(g, "good/") && (o.InputTokens != 12 || o.OutputTokens != 4 || o.Cost != 0.012+0.008) {
			t.Fatalf("%s: %+v", g, o)
		}
	}
	if n := testutil.ToFloat64(k.cfg.Stats.calls.WithLabelValues("good", "coding", "success")); n != 1 {
		t.Fatalf("prometheus: %v successful coding calls of good", n)
	}
	// Observed: cheap fails every call. The chain starts with good.
	k.cfg.Observer = func(string) func(string) (modelrouter.Observed, bool) {
		return func(m string) (modelrouter.Observed, bool) {
			if m == "cheap" {
				return modelrouter.Observed{Calls: 50, SuccessRate: 0, P50MS: 20}, true
			}
			return modelrouter.Observed{}, false
		}
	}
	before := failing.Calls() + limited.Calls()
	_, use, err := run(t, k, inv, t.Context(), `{"prompt":"hi","tier":"small"}`)
	if err != nil || use.Routing.Chosen != "good" || failing.Calls()+limited.Calls() != before {
		t.Fatalf("routing with observed statistics: %+v %v", use.Routing, err)
	}
}
