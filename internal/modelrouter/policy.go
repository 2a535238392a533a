package modelrouter

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/toolgate/toolgate/api"
)

// RoutingQuery is the rule a routing policy must define.
const RoutingQuery = "data.toolgate.routing.order"

//go:embed routing.rego
var defaultRouting string

// DefaultRoutingModule returns the routing policy shipped in the binary.
func DefaultRoutingModule() string { return defaultRouting }

// Ranker orders the models that can serve a call, best first.
type Ranker interface {
	Rank(ctx context.Context, policy string, req *Request, ms []*Model) ([]*Model, error)
}

// RegoRanker ranks with a Rego routing policy, evaluated in-process.
// The query is prepared once and is safe for concurrent use.
type RegoRanker struct {
	query rego.PreparedEvalQuery
}

// forbidden are builtins a routing policy must never call.
var forbidden = map[string]bool{"http.send": true, "net.lookup_ip_addr": true, "opa.runtime": true}

// NewRegoRanker compiles module (the shipped one when empty) and prepares
// its query.
func NewRegoRanker(ctx context.Context, module string) (*RegoRanker, error) {
	if module == "" {
		module = defaultRouting
	}
	caps := ast.CapabilitiesForThisVersion()
	kept := caps.Builtins[:0]
	for _, b := range caps.Builtins {
		if !forbidden[b.Name] {
			kept = append(kept, b)
		}
	}
	caps.Builtins = kept
	q, err := rego.New(rego.Query(RoutingQuery), rego.Module("routing.rego", module), rego.Capabilities(caps)).PrepareForEval(ctx)
	if err != nil {
		return nil, fmt.Errorf("routing policy: %w", err)
	}
	return &RegoRanker{query: q}, nil
}

// Rank implements Ranker. A policy that leaves a candidate out of its order
// drops it; one that names no candidate refuses the call (E3851).
func (r *RegoRanker) Rank(ctx context.Context, policy string, req *Request, ms []*Model) ([]*Model, error) {
	if len(ms) == 0 {
		return ms, nil
	}
	cands := make([]*ast.Term, 0, len(ms))
	byName := make(map[string]*Model, len(ms))
	for _, m := range ms {
		byName[m.Name] = m
		caps := make([]*ast.Term, 0, len(m.Capabilities))
		for _, c := range m.Capabilities {
			caps = append(caps, ast.StringTerm(c))
		}
		items := [][2]*ast.Term{
			ast.Item(ast.StringTerm("name"), ast.StringTerm(m.Name)),
			ast.Item(ast.StringTerm("tier"), ast.StringTerm(m.Tier)),
			ast.Item(ast.StringTerm("tier_index"), ast.IntNumberTerm(tierIndex(m.Tier))),
			ast.Item(ast.StringTerm("context_window"), ast.IntNumberTerm(m.ContextWindow)),
			ast.Item(ast.StringTerm("latency_ms"), ast.IntNumberTerm(int(req.latency(m)))),
			ast.Item(ast.StringTerm("typical_latency_ms"), ast.IntNumberTerm(int(m.LatencyMS))),
			ast.Item(ast.StringTerm("est_cost"), ast.FloatNumberTerm(estCost(m, req))),
			ast.Item(ast.StringTerm("price_1k"), ast.FloatNumberTerm(m.Price.Cost(1000, 1000))),
			ast.Item(ast.StringTerm("capabilities"), ast.ArrayTerm(caps...)),
		}
		if o, ok := req.observed(m); ok {
			items = append(items, ast.Item(ast.StringTerm("observed"), ast.ObjectTerm(
				ast.Item(ast.StringTerm("calls"), ast.IntNumberTerm(int(o.Calls))),
				ast.Item(ast.StringTerm("success_rate"), ast.FloatNumberTerm(o.SuccessRate)),
				ast.Item(ast.StringTerm("p50_ms"), ast.FloatNumberTerm(o.P50MS)),
				ast.Item(ast.StringTerm("p95_ms"), ast.FloatNumberTerm(o.P95MS)),
			)))
		}
		cands = append(cands, ast.ObjectTerm(items...))
	}
	input := ast.NewObject(
		ast.Item(ast.StringTerm("policy"), ast.StringTerm(policy)),
		ast.Item(ast.StringTerm("candidates"), ast.ArrayTerm(cands...)),
	)
	rs, err := r.query.Eval(ctx, rego.EvalParsedInput(input))
	if err != nil {
		return nil, api.WrapError(err, api.InternalError, api.EModelNoCandidate, "routing policy: %v", err)
	}
	var names []any
	if len(rs) == 1 && len(rs[0].Expressions) == 1 {
		names, _ = rs[0].Expressions[0].Value.([]any)
	}
	out := make([]*Model, 0, len(names))
	for _, n := range names {
		s, _ := n.(string)
		if m, ok := byName[s]; ok {
			out = append(out, m)
			delete(byName, s)
		}
	}
	if len(out) == 0 {
		return nil, api.NewError(api.InvalidParameters, api.EModelNoCandidate,
			"the routing policy ranks no model under policy %q", policy).WithDetail("not_started", true)
	}
	return out, nil
}

// estCost is a call's estimated cost on m: its input and the most output
// it may ask for.
func estCost(m *Model, req *Request) float64 {
	out := req.MaxOutputTokens
	if out == 0 || out > m.MaxOutputTokens {
		out = m.MaxOutputTokens
	}
	return m.Price.Cost(int64(req.InputTokens), int64(out))
}
