package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/modelrouter"
	"github.com/toolgate/toolgate/internal/modelrouter/modeltest"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/kvstore"
)

// TestModelStatsEndToEnd: model calls through every stage, to a local
// OpenAI-compatible server that answers and one that fails with 500, are
// counted in the model statistics bucket by model and task type (the
// fallback attempts too) and read back through the operators' models.stats
// endpoint; once the failing model has enough recent calls, routing ranks
// it last and the calls stop reaching it.
func TestModelStatsEndToEnd(t *testing.T) {
	good := modeltest.New(t, "openai")
	failing := modeltest.New(t, "openai")
	failing.Set(modeltest.Fail500)
	e := newEnv(t, topology.TopologyOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	store, err := kvstore.Open(ctx, e.js, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// latency-first prefers "quick" by the catalogue; it always fails.
	for _, doc := range []string{
		fmt.Sprintf(`{"name":"quick","api":"openai","endpoints":[%q],"tier":"small","context_window":8000,"max_output_tokens":64,
		  "price":{"input_per_1k":1,"output_per_1k":1},"latency_ms":100,"retry":{"max_attempts":1},
		  "circuit_breaker":{"failure_rate_threshold":100,"sliding_window_size":100,"minimum_calls":1000,"wait_duration_seconds":1}}`, failing.Base()),
		fmt.Sprintf(`{"name":"steady","api":"openai","endpoints":[%q],"tier":"small","context_window":8000,"max_output_tokens":64,
		  "price":{"input_per_1k":1,"output_per_1k":2},"latency_ms":5000}`, good.Base()),
	} {
		if _, err := store.PutModel(ctx, []byte(doc)); err != nil {
			t.Fatal(err)
		}
	}
	n := e.startPipeline(node.Config{Stage: node.StageConfig{ModelStatsFlush: 50 * time.Millisecond}})
	registerTools(t, n, `{"id":"test.llm_stats","name":"llm","version":"1.0.0","description":"asks a model","kind":"model",
	  "model":{"policy":"latency-first"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "permissions":{"network":[{"host":"127.0.0.1"}]},"limits":{"timeout_ms":20000}}`)
	var ports []int
	for _, s := range []*modeltest.Server{good, failing} {
		u, _ := url.Parse(s.URL)
		p, _ := strconv.Atoi(u.Port())
		ports = append(ports, p)
	}
	const tenant = "mstats"
	call := func(params string) string {
		t.Helper()
		c := grant(tenant, "test.llm_stats")
		c.Network = &token.NetworkGrant{AllowedHosts: []string{"127.0.0.1"}, AllowedPorts: ports}
		resp := e.invoke(withTok(request(tenant, "test.llm_stats", params), mint(t, c)))
		if resp.Status != api.StatusSuccess {
			t.Fatalf("call: %s %+v", resp.Status, resp.Error)
		}
		var r struct {
			Model string `json:"model"`
		}
		if err := json.Unmarshal(resp.Result, &r); err != nil {
			t.Fatal(err)
		}
		return r.Model
	}
	// Three coding calls: each tries quick (500), then steady answers.
	for range 3 {
		if m := call(`{"prompt":"hi","task":{"type":"coding"}}`); m != "steady" {
			t.Fatalf("answered by %s", m)
		}
	}
	var st api.ModelStatsResponse
	eventually(t, 10*time.Second, "the statistics of three calls", func() bool {
		st, err = e.client.ModelStats(ctx, api.ModelStatsRequest{TaskType: "coding"})
		return err == nil && len(st.Models) == 2 && st.Models[0].Calls == 3 && st.Models[1].Calls == 3
	})
	q, s := st.Models[0], st.Models[1]
	if q.Model != "quick" || q.Successes != 0 || q.Failures[modelrouter.FailServer] != 3 || q.InputTokens != 0 {
		t.Fatalf("quick: %+v", q)
	}
	if s.Model != "steady" || s.SuccessRate != 1 || s.InputTokens != 3*12 || s.OutputTokens != 3*4 ||
		s.Cost != 3*(0.012+0.008) || s.P50MS <= 0 {
		t.Fatalf("steady: %+v", s)
	}
	if st.WindowSeconds != int64(kvstore.DefaultModelStatsTTL/time.Second) {
		t.Fatalf("window %d s", st.WindowSeconds)
	}
	if other, err := e.client.ModelStats(ctx, api.ModelStatsRequest{Model: "steady", TaskType: "research"}); err != nil || len(other.Models) != 0 {
		t.Fatalf("filtered to a task type without calls: %+v %v", other, err)
	}
	// Enough failures observed: quick is ranked after steady, and no call
	// reaches it any more.
	for range modelrouter.MinObservedCalls - 3 {
		call(`{"prompt":"hi","task":{"type":"coding"}}`)
	}
	eventually(t, 10*time.Second, "the failures to reach routing", func() bool {
		before := failing.Calls()
		return call(`{"prompt":"hi","task":{"type":"coding"}}`) == "steady" && failing.Calls() == before
	})
	by, err := e.client.ModelStats(ctx, api.ModelStatsRequest{Model: "quick", ByModel: true})
	if err != nil || len(by.Models) != 1 || by.Models[0].TaskType != "*" || by.Models[0].Calls < modelrouter.MinObservedCalls {
		t.Fatalf("quick by model: %+v %v", by, err)
	}
}
