package modelrouter

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/api"
)

func testCatalogue(t testing.TB) map[string]*Model {
	t.Helper()
	ms := []Model{
		{Name: "small-a", API: OpenAI, Endpoints: []string{"http://127.0.0.1:1/v1"}, Tier: "small", ContextWindow: 8000,
			Price: Price{0.5, 1.5}, LatencyMS: 1000},
		{Name: "small-b", API: OpenAI, Endpoints: []string{"http://127.0.0.1:2/v1"}, Tier: "small", ContextWindow: 16000,
			Price: Price{1, 2}, LatencyMS: 800, Capabilities: []string{"code"}},
		{Name: "medium-a", API: Anthropic, Endpoints: []string{"http://127.0.0.1:3/v1"}, Tier: "medium", ContextWindow: 128000,
			Price: Price{3, 15}, LatencyMS: 4000, Capabilities: []string{"code"}, Fallback: []string{"large-b"}},
		{Name: "large-a", API: Anthropic, Endpoints: []string{"http://127.0.0.1:4/v1"}, Tier: "large", ContextWindow: 200000,
			Price: Price{15, 75}, LatencyMS: 9000, Capabilities: []string{"code"}},
		{Name: "large-b", API: OpenAI, Endpoints: []string{"http://127.0.0.1:5/v1"}, Tier: "large", ContextWindow: 128000,
			Price: Price{10, 30}, LatencyMS: 6000, Capabilities: []string{"code", "vision"}},
	}
	c := map[string]*Model{}
	for _, m := range ms {
		if err := m.Normalize(); err != nil {
			t.Fatal(err)
		}
		c[m.Name] = &m
	}
	return c
}

// TestRouteDecisionTree walks the decision tree, its
// constraints and policies.
func TestRouteDecisionTree(t *testing.T) {
	rk, err := NewRegoRanker(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, ranker := range []Ranker{nil, rk} {
		name := "go"
		if ranker != nil {
			name = "rego"
		}
		t.Run(name, func(t *testing.T) { routeTable(t, ranker) })
	}
}

func routeTable(t *testing.T, ranker Ranker) {
	cat := testCatalogue(t)
	rules := DefaultRules()
	rules.Ranker = ranker
	cases := []struct {
		name       string
		req        Request
		complexity string
		chain      string // the chain, comma-separated; a prefix is enough
		ecode      string
	}{
		{"simple classification: small, cheapest first", Request{Task: Task{Type: "classification"}, InputTokens: 100},
			Simple, "small-a,small-b", ""},
		{"simple formatting: small", Request{Task: Task{Type: "formatting"}, InputTokens: 100}, Simple, "small-a", ""},
		{"no task at all: simple", Request{InputTokens: 10}, Simple, "small-a", ""},
		{"simple but creative: medium", Request{Task: Task{Type: "simple_query", Traits: []string{"creativity"}}, InputTokens: 100},
			Simple, "medium-a", ""},
		{"hint best: large", Request{Hint: "best", Task: Task{Type: "classification"}, InputTokens: 100}, Simple, "large-b,large-a", ""},
		{"hint fast: small", Request{Hint: "fast", Task: Task{Type: "research", Traits: []string{"multi_step_reasoning"}}, InputTokens: 100},
			Moderate, "small-a", ""},
		{"moderate coding in a well-known language: medium", Request{Task: Task{Type: "coding", Traits: []string{"multi_step_reasoning"},
			Language: "Go"}, InputTokens: 100}, Moderate, "medium-a,large-b", ""},
		{"moderate coding needing extensive reasoning, rare language: large", Request{Task: Task{Type: "coding",
			Traits: []string{"multi_step_reasoning", "extensive_reasoning"}, Language: "cobol"}, InputTokens: 100}, Moderate, "large-b", ""},
		{"moderate analysis: medium", Request{Task: Task{Type: "analysis", Traits: []string{"abstraction"}}, InputTokens: 100},
			Moderate, "medium-a", ""},
		{"moderate, context beyond tier 2: routed up", Request{Task: Task{Type: "analysis", Traits: []string{"abstraction"}},
			InputTokens: 150000}, Moderate, "large-a", ""},
		{"large context adds to the score", Request{Task: Task{Type: "coding"}, InputTokens: 30000}, Moderate, "medium-a", ""},
		{"complex: large", Request{Task: Task{Type: "research", Traits: []string{"multi_step_reasoning", "abstraction", "creativity"}},
			InputTokens: 100}, Complex, "large-b,large-a", ""},
		{"complex, novel without similar patterns: large", Request{Task: Task{Type: "novel_problem",
			Traits: []string{"multi_step_reasoning", "abstraction", "high_uncertainty", "novel"}}, InputTokens: 100}, Complex, "large-b", ""},
		{"complex, safety critical: large even on a tight budget", Request{BudgetConstrained: true, Task: Task{Type: "architecture",
			Traits: []string{"multi_step_reasoning", "abstraction", "creativity", "safety_critical"}}, InputTokens: 100}, Complex, "large-b", ""},
		{"complex on a tight budget: medium, falling back to large", Request{BudgetConstrained: true, Task: Task{Type: "architecture",
			Traits: []string{"multi_step_reasoning", "abstraction", "creativity"}}, InputTokens: 100}, Complex, "medium-a,large-b,large-a", ""},
		{"tier asked for", Request{Tier: "medium", InputTokens: 100}, "", "medium-a", ""},
		{"model named: it and its fallbacks", Request{Model: "medium-a", InputTokens: 100}, "", "medium-a,large-b", ""},
		{"required capability", Request{Tier: "small", Constraints: Constraints{Capabilities: []string{"code"}}, InputTokens: 100},
			"", "small-b", ""},
		{"required capability only a larger tier has: routed up", Request{Tier: "small",
			Constraints: Constraints{Capabilities: []string{"vision"}}, InputTokens: 100}, "", "large-b", ""},
		{"max latency", Request{Tier: "large", Constraints: Constraints{MaxLatencyMS: 7000}, InputTokens: 100}, "", "large-b", ""},
		{"max cost", Request{Tier: "small", Constraints: Constraints{MaxCost: 1.6}, InputTokens: 100}, "", "small-a", ""},
		{"required context window", Request{Tier: "large", Constraints: Constraints{ContextTokens: 150000}}, "", "large-a", ""},
		{"quality first", Request{Tier: "large", Policy: QualityFirst, InputTokens: 100}, "", "large-a,large-b", ""},
		{"latency first", Request{Tier: "small", Policy: LatencyFirst, InputTokens: 100}, "", "small-b,small-a", ""},
		{"allowed models only", Request{Tier: "small", Allowed: []string{"small-b"}, InputTokens: 100}, "", "small-b", ""},
		{"unknown model", Request{Model: "gpt-9"}, "", "", api.EModelUnknown},
		{"named model not allowed", Request{Model: "large-a", Allowed: []string{"small-a"}}, "", "", api.EModelUnknown},
		{"no model meets the constraints", Request{Constraints: Constraints{MaxLatencyMS: 10}}, "", "", api.EModelNoCandidate},
		{"fits no window", Request{InputTokens: 250000}, "", "", api.EModelContextWindow},
		{"named model too small", Request{Model: "small-a", InputTokens: 9000}, "", "", api.EModelContextWindow},
		{"unknown policy", Request{Policy: "random"}, "", "", api.EModelNoCandidate},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := rules.Route(t.Context(), cat, c.req)
			if c.ecode != "" {
				var te *api.Error
				if !errors.As(err, &te) || te.ECode != c.ecode {
					t.Fatalf("got %v, want %s", err, c.ecode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(d.Routing.Chain, ",")
			if !strings.HasPrefix(got, c.chain) || d.Chain[0].Name != d.Routing.Chosen {
				t.Fatalf("chain %s, want %s…", got, c.chain)
			}
			if d.Routing.Complexity != c.complexity {
				t.Fatalf("complexity %s, want %s", d.Routing.Complexity, c.complexity)
			}
			if !slices.ContainsFunc(d.Routing.Considered, func(x api.Candidate) bool { return x.Model == d.Routing.Chosen && x.Reason == "" }) {
				t.Fatalf("the chosen model is not among those considered: %+v", d.Routing.Considered)
			}
		})
	}
}

// TestRoutingPolicyIsRego: an operator's Rego policy changes the order
// without code; one that ranks nothing refuses the call.
func TestRoutingPolicyIsRego(t *testing.T) {
	priciest := `package toolgate.routing
order := [x[1] | some x in sort([[0 - c.est_cost, c.name] | some c in input.candidates])]`
	rk, err := NewRegoRanker(t.Context(), priciest)
	if err != nil {
		t.Fatal(err)
	}
	rules := DefaultRules()
	rules.Ranker = rk
	d, err := rules.Route(t.Context(), testCatalogue(t), Request{Tier: "small"})
	if err != nil || d.Routing.Chosen != "small-b" {
		t.Fatalf("chose %s, %v", d.Routing.Chosen, err)
	}
	if _, err := rules.Route(t.Context(), testCatalogue(t), Request{Tier: "small", Policy: "random"}); err == nil {
		t.Fatal("an unknown policy was accepted")
	}
	none, err := NewRegoRanker(t.Context(), "package toolgate.routing\norder := []")
	if err != nil {
		t.Fatal(err)
	}
	rules.Ranker = none
	var te *api.Error
	if _, err := rules.Route(t.Context(), testCatalogue(t), Request{Tier: "small"}); !errors.As(err, &te) || te.ECode != api.EModelNoCandidate {
		t.Fatalf("got %v, want E3851", err)
	}
	if _, err := NewRegoRanker(t.Context(), "package toolgate.routing\norder := http.send({})"); err == nil {
		t.Fatal("a policy calling http.send compiled")
	}
}

// TestRulesAreData: an operator's rules change the decision without code.
func TestRulesAreData(t *testing.T) {
	rules := DefaultRules()
	rules.TierRules = append([]TierRule{{Complexity: Simple, TaskTypes: []string{"classification"}, Tier: "large"}}, rules.TierRules...)
	d, err := rules.Route(t.Context(), testCatalogue(t), Request{Task: Task{Type: "classification"}})
	if err != nil || d.Routing.Tier != "large" {
		t.Fatalf("tier %s, %v", d.Routing.Tier, err)
	}
}

func TestTruncate(t *testing.T) {
	msgs := []Message{{Role: "user", Content: "the task: " + strings.Repeat("a ", 50)}}
	for range 10 {
		msgs = append(msgs, Message{Role: "user", Content: strings.Repeat("b ", 50)})
	}
	msgs = append(msgs, Message{Role: "user", Content: "the latest"})
	for _, strategy := range []string{TruncateOldest, TruncateMiddle} {
		out, ok := Truncate(strategy, "sys", msgs, 200)
		if !ok || CountMessages("sys", out) > 200 || out[len(out)-1].Content != "the latest" {
			t.Fatalf("%s: %d messages, %d tokens, ok %v", strategy, len(out), CountMessages("sys", out), ok)
		}
		if keepsTask := strings.HasPrefix(out[0].Content, "the task"); keepsTask != (strategy == TruncateMiddle) {
			t.Fatalf("%s: first message %q", strategy, out[0].Content)
		}
	}
	if _, ok := Truncate(TruncateOldest, "", []Message{{Role: "user", Content: strings.Repeat("x ", 500)}}, 100); ok {
		t.Fatal("one message over the limit was reported as fitting")
	}
}

// TestCountTokens checks the offline tokenizer against cl100k_base's known
// encoding.
func TestCountTokens(t *testing.T) {
	if n := CountText("hello world"); n != 2 {
		t.Fatalf("hello world is %d tokens, want 2", n)
	}
	if n := CountText("tiktoken is great!"); n != 6 {
		t.Fatalf("%d tokens, want 6", n)
	}
}

// BenchmarkRoute measures one routing decision (goal: at most 50 µs),
// ranked in Go and by the shipped Rego policy.
func BenchmarkRoute(b *testing.B) {
	for _, name := range []string{"go", "rego"} {
		b.Run(name, func(b *testing.B) { benchRoute(b, name == "rego") })
	}
}

func benchRoute(b *testing.B, withRego bool) {
	ctx := b.Context()
	cat := testCatalogue(b)
	rules := DefaultRules()
	if withRego {
		rk, err := NewRegoRanker(ctx, "")
		if err != nil {
			b.Fatal(err)
		}
		rules.Ranker = rk
	}
	// A complex task: both large models are candidates, ranked by policy.
	req := Request{Task: Task{Type: "research", Traits: []string{"multi_step_reasoning", "abstraction", "creativity"}},
		Constraints: Constraints{MaxCost: 1000, Capabilities: []string{"code"}}, InputTokens: 2000}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := rules.Route(ctx, cat, req); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/decision")
}

// TestObservedStatsFlipRouting: what the cluster observed of models' calls
// changes decisions the catalogue alone would make, with the shipped Rego
// policy and with the Go ranking that mirrors it; too few calls change
// nothing.
func TestObservedStatsFlipRouting(t *testing.T) {
	rk, err := NewRegoRanker(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	type obs = map[string]Observed
	cases := []struct {
		name     string
		req      Request
		observed obs
		chain    string // a prefix of the chain
	}{
		{"latency first, catalogue: small-b (800 ms) before small-a (1000 ms)",
			Request{Tier: "small", Policy: LatencyFirst}, nil, "small-b,small-a"},
		{"latency first, small-b observed slow: small-a first",
			Request{Tier: "small", Policy: LatencyFirst},
			obs{"small-b": {Calls: 50, SuccessRate: 1, P50MS: 2000}, "small-a": {Calls: 50, SuccessRate: 1, P50MS: 900}}, "small-a,small-b"},
		{"latency first, too few calls observed: the catalogue decides",
			Request{Tier: "small", Policy: LatencyFirst},
			obs{"small-b": {Calls: MinObservedCalls - 1, SuccessRate: 1, P50MS: 2000}}, "small-b,small-a"},
		{"max latency, catalogue: large-a (9000 ms) left out",
			Request{Tier: "large", Constraints: Constraints{MaxLatencyMS: 7000}}, nil, "large-b"},
		{"max latency, large-b observed over it and large-a under it: large-a",
			Request{Tier: "large", Constraints: Constraints{MaxLatencyMS: 7000}},
			obs{"large-a": {Calls: 30, SuccessRate: 1, P50MS: 5000}, "large-b": {Calls: 30, SuccessRate: 1, P50MS: 8000}}, "large-a"},
		{"cost first, small-a unreliable: demoted behind small-b",
			Request{Tier: "small", InputTokens: 100},
			obs{"small-a": {Calls: 100, SuccessRate: 0.5, P50MS: 100}}, "small-b,small-a"},
		{"cost first, small-a reliable enough: still first",
			Request{Tier: "small", InputTokens: 100},
			obs{"small-a": {Calls: 100, SuccessRate: 0.85, P50MS: 100}}, "small-a,small-b"},
		{"latency first, equal medians: the higher success rate breaks the tie",
			Request{Tier: "small", Policy: LatencyFirst},
			obs{"small-a": {Calls: 40, SuccessRate: 0.99, P50MS: 700}, "small-b": {Calls: 40, SuccessRate: 0.9, P50MS: 700}}, "small-a,small-b"},
		{"latency first, equal medians and rates: by name",
			Request{Tier: "small", Policy: LatencyFirst},
			obs{"small-a": {Calls: 40, SuccessRate: 0.9, P50MS: 700}, "small-b": {Calls: 40, SuccessRate: 0.9, P50MS: 700}}, "small-a,small-b"},
	}
	for _, ranker := range []Ranker{nil, rk} {
		name := "go"
		if ranker != nil {
			name = "rego"
		}
		rules := DefaultRules()
		rules.Ranker = ranker
		for _, c := range cases {
			t.Run(name+"/"+c.name, func(t *testing.T) {
				req := c.req
				if c.observed != nil {
					req.Observe = func(m string) (Observed, bool) { o, ok := c.observed[m]; return o, ok }
				}
				d, err := rules.Route(t.Context(), testCatalogue(t), req)
				if err != nil {
					t.Fatal(err)
				}
				if got := strings.Join(d.Routing.Chain, ","); !strings.HasPrefix(got, c.chain) {
					t.Fatalf("chain %s, want %s…", got, c.chain)
				}
				for _, x := range d.Routing.Considered {
					o, ok := c.observed[x.Model]
					if used := ok && o.Calls >= MinObservedCalls; used != (x.Observed != nil) {
						t.Fatalf("candidate %s: observed %+v recorded as %+v", x.Model, o, x.Observed)
					}
				}
			})
		}
	}
}
