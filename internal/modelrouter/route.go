package modelrouter

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/toolgate/toolgate/api"
)

// Complexity classes.
const (
	Simple   = "simple"
	Moderate = "moderate"
	Complex  = "complex"
)

// Policies rank eligible models.
const (
	CostFirst    = "cost-first"
	QualityFirst = "quality-first"
	LatencyFirst = "latency-first"
)

// Policies lists the routing policies.
var Policies = []string{CostFirst, QualityFirst, LatencyFirst}

// Rules classify a task's complexity and map it to a tier: the
// decision tree, held as data so an operator can change it.
type Rules struct {
	// TaskScores and TraitScores add up to the complexity score.
	TaskScores  map[string]int `json:"task_scores"`
	TraitScores map[string]int `json:"trait_scores"`
	// LargeContextTokens adds one when the input is larger.
	LargeContextTokens int `json:"large_context_tokens"`
	// SimpleMax and ModerateMax are the class bounds of the score.
	SimpleMax   int `json:"simple_max"`
	ModerateMax int `json:"moderate_max"`
	// WellKnownLanguages are the languages a medium model codes well.
	WellKnownLanguages []string `json:"well_known_languages"`
	// TierRules are tried in order; the first that matches gives the tier.
	TierRules []TierRule `json:"tier_rules"`
	// Ranker orders the candidates by policy; nil ranks in Go with the
	// shipped policy's semantics (the model kind uses the Rego policy).
	Ranker Ranker `json:"-"`
}

// TierRule matches when every condition it sets holds.
type TierRule struct {
	Hint              string   `json:"hint,omitempty"`
	Complexity        string   `json:"complexity,omitempty"`
	TaskTypes         []string `json:"task_types,omitempty"`
	Traits            []string `json:"traits,omitempty"`
	Absent            []string `json:"absent,omitempty"`
	KnownLanguage     bool     `json:"known_language,omitempty"`
	BudgetConstrained bool     `json:"budget_constrained,omitempty"`
	// Tier is the tier chosen; Then, when set, the tier the chain falls
	// back to after it.
	Tier string `json:"tier"`
	Then string `json:"then,omitempty"`
}

//go:embed rules.json
var defaultRules []byte

// DefaultRules returns the shipped rules.
func DefaultRules() Rules {
	var r Rules
	if err := json.Unmarshal(defaultRules, &r); err != nil {
		panic("modelrouter: shipped rules: " + err.Error())
	}
	return r
}

// Task describes what a request asks for, for classification.
type Task struct {
	// Type is a task type such as classification, coding or research.
	Type string `json:"type,omitempty"`
	// Traits are such as multi_step_reasoning, creativity, novel,
	// safety_critical, extensive_reasoning.
	Traits []string `json:"traits,omitempty"`
	// Language is a coding task's programming language.
	Language string `json:"language,omitempty"`
}

// Constraints filter candidates.
type Constraints struct {
	// MaxCost bounds the estimated cost of the call.
	MaxCost float64 `json:"max_cost,omitempty"`
	// MaxLatencyMS bounds a model's typical latency.
	MaxLatencyMS int64 `json:"max_latency_ms,omitempty"`
	// Capabilities must all be offered.
	Capabilities []string `json:"capabilities,omitempty"`
	// ContextTokens is a context window the model must have at least.
	ContextTokens int `json:"context_tokens,omitempty"`
}

// Request is what routing looks at.
type Request struct {
	// Model names one model: it is used with its fallback chain.
	Model string
	// Tier asks for a tier; otherwise the task's complexity decides.
	Tier string
	// Hint is "best" or "fast".
	Hint        string
	Task        Task
	Constraints Constraints
	// Policy ranks eligible models; default cost-first.
	Policy string
	// InputTokens is the request's counted size; MaxOutputTokens what it
	// asks for at most (0: each model's own bound).
	InputTokens     int
	MaxOutputTokens int
	// BudgetConstrained is set when the session's budget is nearly spent.
	BudgetConstrained bool
	// Allowed, when not empty, are the only models the tool may use.
	Allowed []string
	// Observe, when set, returns what the cluster has recently seen of a
	// model's calls (for this task type where there are enough, else for
	// every task type). With MinObservedCalls calls or more, the observed
	// median latency replaces the catalogue's latency_ms and the success
	// rate is handed to the ranking. It must answer from memory.
	Observe func(model string) (Observed, bool)
}

// Classify scores a task and returns its complexity class.
func (r *Rules) Classify(t Task, inputTokens int) string {
	score := r.TaskScores[t.Type]
	for _, tr := range t.Traits {
		score += r.TraitScores[tr]
	}
	if r.LargeContextTokens > 0 && inputTokens > r.LargeContextTokens {
		score++
	}
	switch {
	case score <= r.SimpleMax:
		return Simple
	case score <= r.ModerateMax:
		return Moderate
	}
	return Complex
}

// tier returns the tier for a request of a complexity class, and the tier
// its chain falls back to (may be empty).
func (r *Rules) tier(req *Request, complexity string) (string, string) {
	for _, tr := range r.TierRules {
		switch {
		case tr.Hint != "" && tr.Hint != req.Hint,
			tr.Hint == "" && tr.Complexity != complexity,
			len(tr.TaskTypes) > 0 && !slices.Contains(tr.TaskTypes, req.Task.Type),
			slices.ContainsFunc(tr.Traits, func(s string) bool { return !slices.Contains(req.Task.Traits, s) }),
			slices.ContainsFunc(tr.Absent, func(s string) bool { return slices.Contains(req.Task.Traits, s) }),
			tr.KnownLanguage && !slices.Contains(r.WellKnownLanguages, strings.ToLower(req.Task.Language)),
			tr.BudgetConstrained && !req.BudgetConstrained:
			continue
		}
		return tr.Tier, tr.Then
	}
	return "medium", ""
}

// Decision is a routing decision: the models to try in order.
type Decision struct {
	Chain   []*Model
	Routing api.Routing
}

// RouteError is a request no model can serve.
func routeErr(ecode, format string, args ...any) *api.Error {
	code := api.InvalidParameters
	if ecode == api.EModelContextWindow {
		code = api.ResourceExhausted
	}
	return api.NewError(code, ecode, format, args...).WithDetail("not_started", true)
}

// Route chooses the models to try for req from the catalogue. It is pure:
// the same catalogue and request give the same decision.
func (r *Rules) Route(ctx context.Context, catalogue map[string]*Model, req Request) (Decision, error) {
	start := time.Now()
	policy := req.Policy
	if policy == "" {
		policy = CostFirst
	}
	if !slices.Contains(Policies, policy) {
		return Decision{}, routeErr(api.EModelNoCandidate, "routing policy %q is not one of %v", policy, Policies)
	}
	rt := api.Routing{Policy: policy, InputTokens: req.InputTokens}
	allowed := func(name string) bool { return len(req.Allowed) == 0 || slices.Contains(req.Allowed, name) }
	// why says why a model cannot serve the request, or "".
	why := func(m *Model) string {
		out := req.MaxOutputTokens
		if out == 0 || out > m.MaxOutputTokens {
			out = m.MaxOutputTokens
		}
		c := req.Constraints
		switch {
		case !allowed(m.Name):
			return "not allowed by the tool"
		case req.InputTokens+out > m.ContextWindow:
			return fmt.Sprintf("context window %d < %d input + %d output tokens", m.ContextWindow, req.InputTokens, out)
		case c.ContextTokens > m.ContextWindow:
			return fmt.Sprintf("context window %d < required %d", m.ContextWindow, c.ContextTokens)
		case slices.ContainsFunc(c.Capabilities, func(s string) bool { return !slices.Contains(m.Capabilities, s) }):
			return "lacks a required capability"
		case c.MaxLatencyMS > 0 && req.latency(m) > c.MaxLatencyMS:
			if _, ok := req.observed(m); ok {
				return fmt.Sprintf("observed median latency %d ms over %d", req.latency(m), c.MaxLatencyMS)
			}
			return fmt.Sprintf("typical latency %d ms over %d", m.LatencyMS, c.MaxLatencyMS)
		case c.MaxCost > 0 && m.Price.Cost(int64(req.InputTokens), int64(out)) > c.MaxCost:
			return fmt.Sprintf("estimated cost %.6f over %g", m.Price.Cost(int64(req.InputTokens), int64(out)), c.MaxCost)
		}
		return ""
	}
	var first *Model
	var eligible []*Model
	var then string
	if req.Model != "" {
		m, ok := catalogue[req.Model]
		if !ok || !allowed(req.Model) {
			return Decision{}, routeErr(api.EModelUnknown, "model %q is not in the catalogue or not allowed for this tool", req.Model).
				WithDetail("model", req.Model)
		}
		rt.Tier = m.Tier
		if reason := why(m); reason != "" {
			rt.Considered = append(rt.Considered, api.Candidate{Model: m.Name, Reason: reason})
		} else {
			first = m
			rt.Considered = append(rt.Considered, api.Candidate{Model: m.Name})
		}
	} else {
		tier := req.Tier
		if tier == "" {
			rt.Complexity = r.Classify(req.Task, req.InputTokens)
			tier, then = r.tier(&req, rt.Complexity)
		} else if tierIndex(tier) < 0 {
			return Decision{}, routeErr(api.EModelNoCandidate, "tier %q is not one of %v", tier, Tiers)
		}
		rt.Tier = tier
		names := make([]string, 0, len(catalogue))
		for n := range catalogue {
			names = append(names, n)
		}
		slices.Sort(names)
		// The tier asked for, else the next one up that has an eligible
		// model (route up: a larger window, more capability).
		for ti := tierIndex(tier); ti < len(Tiers) && len(eligible) == 0; ti++ {
			for _, n := range names {
				m := catalogue[n]
				if m.Tier != Tiers[ti] || !allowed(n) {
					continue
				}
				reason := why(m)
				rt.Considered = append(rt.Considered, api.Candidate{Model: n, Reason: reason})
				if reason == "" {
					eligible = append(eligible, m)
				}
			}
		}
		var err error
		if eligible, err = r.rank(ctx, eligible, policy, &req); err != nil {
			return Decision{Routing: rt}, err
		}
		if len(eligible) > 0 {
			first = eligible[0]
		}
	}
	if first == nil {
		code, msg := api.EModelNoCandidate, "no model meets the request's constraints"
		if slices.ContainsFunc(rt.Considered, func(c api.Candidate) bool { return strings.HasPrefix(c.Reason, "context window") }) &&
			!slices.ContainsFunc(rt.Considered, func(c api.Candidate) bool { return c.Reason != "" && !strings.HasPrefix(c.Reason, "context window") }) {
			code, msg = api.EModelContextWindow, fmt.Sprintf("the request's %d tokens fit the context window of no model it may use", req.InputTokens)
		}
		return Decision{Routing: rt}, routeErr(code, "%s", msg).WithDetail("considered", rt.Considered)
	}
	// The chain: the chosen model, its declared fallbacks that can serve
	// the request, the other eligible models in rank order, then (per the
	// tier rule) the models of the tier to fall back to.
	chain := []*Model{first}
	add := func(m *Model) {
		if m != nil && !slices.Contains(chain, m) && why(m) == "" {
			chain = append(chain, m)
		}
	}
	for _, n := range first.Fallback {
		add(catalogue[n])
	}
	for _, m := range eligible[min(1, len(eligible)):] {
		add(m)
	}
	if then != "" {
		var up []*Model
		for _, m := range catalogue {
			if m.Tier == then {
				up = append(up, m)
			}
		}
		up, _ = r.rank(ctx, up, policy, &req) // a fallback tier the policy refuses adds nothing
		for _, m := range up {
			add(m)
		}
	}
	rt.Chosen = first.Name
	for _, m := range chain {
		rt.Chain = append(rt.Chain, m.Name)
	}
	for i := range rt.Considered {
		m := catalogue[rt.Considered[i].Model]
		if m == nil {
			continue
		}
		if rt.Considered[i].Reason == "" {
			rt.Considered[i].Score = score(m, policy, req)
		}
		if o, ok := req.observed(m); ok {
			rt.Considered[i].Observed = &api.ModelObserved{Calls: o.Calls, SuccessRate: o.SuccessRate, P50MS: o.P50MS}
		}
	}
	rt.DecisionNS = time.Since(start).Nanoseconds()
	return Decision{Chain: chain, Routing: rt}, nil
}

// score is a model's rank under a policy: lower is better.
func score(m *Model, policy string, req Request) float64 {
	switch policy {
	case QualityFirst:
		// Larger tier first, then larger window; cost breaks ties.
		return -float64(tierIndex(m.Tier))*1e9 - float64(m.ContextWindow) + m.Price.Cost(1000, 1000)
	case LatencyFirst:
		return float64(req.latency(m))
	}
	out := req.MaxOutputTokens
	if out == 0 || out > m.MaxOutputTokens {
		out = m.MaxOutputTokens
	}
	return m.Price.Cost(int64(req.InputTokens), int64(out))
}

// rank orders ms with the Ranker, else in Go.
func (r *Rules) rank(ctx context.Context, ms []*Model, policy string, req *Request) ([]*Model, error) {
	if r.Ranker != nil && len(ms) > 1 {
		return r.Ranker.Rank(ctx, policy, req, ms)
	}
	rankGo(ms, policy, *req)
	return ms, nil
}

// rankGo is the shipped Rego policy in Go: reliable models first (see
// UnreliableBelow), then by the policy's score, then the higher observed
// success rate, then by name.
func rankGo(ms []*Model, policy string, req Request) {
	slices.SortStableFunc(ms, func(a, b *Model) int {
		ua, ub := req.unreliable(a), req.unreliable(b)
		if ua != ub {
			if ub {
				return -1
			}
			return 1
		}
		sa, sb := score(a, policy, req), score(b, policy, req)
		switch {
		case sa < sb:
			return -1
		case sa > sb:
			return 1
		}
		ra, rb := req.successRate(a), req.successRate(b)
		switch {
		case ra > rb:
			return -1
		case ra < rb:
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
}
