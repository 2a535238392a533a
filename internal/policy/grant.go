package policy

import (
	"context"
	_ "embed"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/toolgate/toolgate/api"
)

// GrantQuery is the rule that decides capability grants.
const GrantQuery = "data.toolgate.capability.grant"

//go:embed capability.rego
var capabilityModule string

// CapabilityModule returns the grant policy shipped in the binary.
func CapabilityModule() string { return capabilityModule }

// Grant is the policy's answer to a matched capability request.
type Grant struct {
	Allow        bool     `json:"allow"`
	Reasons      []string `json:"reasons,omitempty"`
	Tools        []string `json:"tools"`
	MaxCalls     int64    `json:"max_calls"`
	MaxRuntimeMS int64    `json:"max_runtime_ms"`
	MaxCost      float64  `json:"max_cost"`
	TTLSeconds   int64    `json:"ttl_seconds"`
}

// Grants evaluates the capability grant rule.
type Grants struct{ query rego.PreparedEvalQuery }

// NewGrants prepares GrantQuery over modules (and data). Modules that do
// not compile are refused (E3206); modules without the rule get the
// shipped one added, so an operator's authorization policy alone keeps the
// shipped grants.
func NewGrants(ctx context.Context, modules map[string]string, data map[string]any) (*Grants, error) {
	if data == nil {
		data = map[string]any{}
	}
	if !definesRule(modules, GrantQuery) {
		modules = map[string]string{"capability.rego": capabilityModule}
	}
	opts := []func(*rego.Rego){rego.Query(GrantQuery), rego.Capabilities(capabilities()), rego.Store(inmem.NewFromObject(data))}
	for name, src := range modules {
		opts = append(opts, rego.Module(name, src))
	}
	q, err := rego.New(opts...).PrepareForEval(ctx)
	if err != nil {
		return nil, api.WrapError(err, api.InvalidParameters, api.EPolicyFailed, "capability policy does not compile: %v", err)
	}
	return &Grants{query: q}, nil
}

// DefaultGrants is the shipped grant policy.
func DefaultGrants(ctx context.Context) (*Grants, error) { return NewGrants(ctx, nil, nil) }

// definesRule reports whether modules define the rule ref names.
func definesRule(modules map[string]string, ref string) bool {
	parsed := map[string]*ast.Module{}
	for name, src := range modules {
		m, err := ast.ParseModuleWithOpts(name, src, ast.ParserOptions{RegoVersion: ast.RegoV1})
		if err != nil {
			return true // let compilation report it
		}
		parsed[name] = m
	}
	if len(parsed) == 0 {
		return false
	}
	c := ast.NewCompiler().WithCapabilities(capabilities())
	if c.Compile(parsed); c.Failed() {
		return true
	}
	return len(c.GetRules(ast.MustParseRef(ref))) > 0
}

// Eval evaluates the grant for input. Anything but an object with a true
// allow and a tools list grants nothing.
func (g *Grants) Eval(ctx context.Context, input any) (Grant, error) {
	rs, err := g.query.Eval(ctx, rego.EvalInput(input))
	if err != nil {
		return Grant{Reasons: []string{"policy evaluation failed"}},
			api.WrapError(err, api.InternalError, api.EPolicyFailed, "evaluating capability policy: %v", err)
	}
	if len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return Grant{Reasons: []string{"the policy defines no grant for this request"}}, nil
	}
	obj, ok := rs[0].Expressions[0].Value.(map[string]any)
	if !ok {
		return Grant{Reasons: []string{"the policy's grant is not an object"}}, nil
	}
	out := Grant{}
	out.Allow, _ = obj["allow"].(bool)
	for _, r := range asList(obj["reasons"]) {
		if s, ok := r.(string); ok {
			out.Reasons = append(out.Reasons, s)
		}
	}
	for _, t := range asList(obj["tools"]) {
		if s, ok := t.(string); ok {
			out.Tools = append(out.Tools, s)
		}
	}
	out.MaxCalls = asInt(obj["max_calls"])
	out.MaxRuntimeMS = asInt(obj["max_runtime_ms"])
	out.TTLSeconds = asInt(obj["ttl_seconds"])
	out.MaxCost = asFloat(obj["max_cost"])
	if out.Allow && len(out.Tools) == 0 {
		out.Allow = false
		out.Reasons = append(out.Reasons, "the policy granted no tools")
	}
	if !out.Allow && len(out.Reasons) == 0 {
		out.Reasons = []string{"refused by policy"}
	}
	return out, nil
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func asFloat(v any) float64 {
	switch n := v.(type) {
	case float64:
		return n
	case interface{ Float64() (float64, error) }:
		f, _ := n.Float64()
		return f
	}
	return 0
}

func asInt(v any) int64 { return int64(asFloat(v)) }
