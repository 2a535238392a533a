// Package policy evaluates toolgate's authorization policy, written in Rego,
// in-process with OPA. The query is prepared once; evaluation is safe for
// concurrent use. Whatever is not an explicit allow is a denial.
package policy

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/toolgate/toolgate/api"
)

// Query is the rule every policy must define.
const Query = "data.toolgate.authz.decision"

//go:embed default.rego
var defaultModule string

// DefaultModule returns the policy shipped in the binary.
func DefaultModule() string { return defaultModule }

// Decision is the policy's verdict on one invocation.
type Decision struct {
	Allow            bool     `json:"allow"`
	Reasons          []string `json:"reasons,omitempty"`
	RequiresApproval bool     `json:"requires_approval,omitempty"`
	// Code is the E-code of a denial, when the policy names one.
	Code string `json:"code,omitempty"`
	// Revision is the Engine's Revision: which policy decided.
	Revision uint64 `json:"-"`
	// Approvers is how many different people must approve a call the
	// policy wants approved, when more than one (the two-person rule by
	// risk level, beside a tool's own safety.approvers).
	Approvers int `json:"approvers,omitempty"`
}

// maxApprovers bounds a decision's approvers, as the manifest bounds a
// tool's safety.approvers.
const maxApprovers = 5

// Engine holds one prepared query.
type Engine struct {
	query rego.PreparedEvalQuery
	// memo keeps decisions by what the policy reads of the input (memo.go);
	// nil for a policy whose decisions cannot be kept.
	memo *memo
	// Revision is the policies bucket's revision the engine was loaded
	// from (0: a policy configured at start), set by its loader.
	Revision uint64
}

// forbidden are builtins a policy must never call: they reach the network or
// the host, and a policy is code an operator, not an agent, should control.
var forbidden = map[string]bool{
	"http.send": true, "net.lookup_ip_addr": true, "opa.runtime": true,
}

func capabilities() *ast.Capabilities {
	caps := ast.CapabilitiesForThisVersion()
	kept := caps.Builtins[:0]
	for _, b := range caps.Builtins {
		if !forbidden[b.Name] {
			kept = append(kept, b)
		}
	}
	caps.Builtins = kept
	return caps
}

// New compiles modules (file name → source) with optional data and prepares
// the decision query. Modules that do not compile, or that define no
// toolgate.authz.decision rule, are refused whole (E3206).
func New(ctx context.Context, modules map[string]string, data map[string]any) (*Engine, error) {
	if data == nil {
		data = map[string]any{}
	}
	opts := []func(*rego.Rego){
		rego.Query(Query),
		rego.Capabilities(capabilities()),
		rego.Store(inmem.NewFromObject(data)),
	}
	names := make([]string, 0, len(modules))
	for name := range modules {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		opts = append(opts, rego.Module(name, modules[name]))
	}
	q, err := rego.New(opts...).PrepareForEval(ctx)
	if err != nil {
		return nil, api.WrapError(err, api.InvalidParameters, api.EPolicyFailed, "policy does not compile: %v", err)
	}
	m, err := definesDecision(modules)
	if err != nil {
		return nil, err
	}
	return &Engine{query: q, memo: m}, nil
}

// definesDecision refuses modules without a rule for Query: such a policy
// compiles, but its decision is always undefined, so it would deny every
// call. The modules compiled above, so errors here are not expected. It
// returns the memo for what the policy reads (newMemo), taken from the
// modules once their references are resolved (imports and all) and before
// later stages move a call's arguments into variables of their own: there
// object.get(input.claims, path, d) still names the path it reads.
func definesDecision(modules map[string]string) (*memo, error) {
	parsed := make(map[string]*ast.Module, len(modules))
	for name, src := range modules {
		m, err := ast.ParseModuleWithOpts(name, src, ast.ParserOptions{RegoVersion: ast.RegoV1})
		if err != nil {
			return nil, api.WrapError(err, api.InvalidParameters, api.EPolicyFailed, "policy does not compile: %v", err)
		}
		parsed[name] = m
	}
	var m *memo
	c := ast.NewCompiler().WithCapabilities(capabilities()).
		WithStageAfterID(ast.StageRewriteEquals, ast.CompilerStageDefinition{Name: "MemoReads", MetricName: "toolgate_memo_reads",
			Stage: func(c *ast.Compiler) *ast.Error { m = newMemo(c); return nil }})
	if c.Compile(parsed); c.Failed() {
		return nil, api.WrapError(c.Errors, api.InvalidParameters, api.EPolicyFailed, "policy does not compile: %v", c.Errors)
	}
	if len(c.GetRules(ast.MustParseRef(Query))) == 0 {
		return nil, api.NewError(api.InvalidParameters, api.EPolicyFailed,
			"policy defines no %s rule: every call would be denied (declare package toolgate.authz and a decision rule)", strings.TrimPrefix(Query, "data."))
	}
	return m, nil
}

// Default returns an Engine for the shipped policy.
func Default(ctx context.Context) (*Engine, error) {
	return New(ctx, map[string]string{"default.rego": defaultModule}, nil)
}

// LoadFile builds an Engine from one .rego file.
func LoadFile(ctx context.Context, path string) (*Engine, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return New(ctx, map[string]string{filepath.Base(path): string(src)}, nil)
}

// LoadDir builds an Engine from every *.rego file in dir and, if present,
// the document in dir/data.json.
func LoadDir(ctx context.Context, dir string) (*Engine, error) {
	modules, data, err := ReadDir(dir)
	if err != nil {
		return nil, err
	}
	return New(ctx, modules, data)
}

// ReadDir reads the policy in dir: every *.rego file by name except
// *_test.rego, and the data document in data.json if there is one.
func ReadDir(dir string) (map[string]string, map[string]any, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("policy: %w", err)
	}
	modules := map[string]string{}
	for _, e := range entries {
		// Rego unit tests (OPA's *_test.rego convention) are not policy.
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".rego") || strings.HasSuffix(e.Name(), "_test.rego") {
			continue
		}
		src, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, nil, fmt.Errorf("policy: %w", err)
		}
		modules[e.Name()] = string(src)
	}
	if len(modules) == 0 {
		return nil, nil, fmt.Errorf("policy: no .rego files in %s", dir)
	}
	var data map[string]any
	if b, err := os.ReadFile(filepath.Join(dir, "data.json")); err == nil {
		if err := json.Unmarshal(b, &data); err != nil {
			return nil, nil, fmt.Errorf("policy data %s: %w", filepath.Join(dir, "data.json"), err)
		}
	} else if !os.IsNotExist(err) {
		return nil, nil, fmt.Errorf("policy: %w", err)
	}
	return modules, data, nil
}

// Eval evaluates the decision for input. A denial is a Decision with Allow
// false; an error means the policy could not be evaluated, and the caller
// must deny too (it is a *api.Error with E3206).
//
// input is either plain Go (maps, slices, strings, numbers, booleans, or
// anything encoding/json encodes), which OPA converts on every call, or an
// ast.Value already in the form OPA evaluates, which is used as it is and
// must not be changed after (the memo may keep parts of it).
func (e *Engine) Eval(ctx context.Context, input any) (Decision, error) {
	v, parsed := input.(ast.Value)
	if !parsed || e.memo == nil {
		return e.eval(ctx, input)
	}
	// The key is read on the stack; the memo keeps a copy of a new one.
	var buf [32]readValue
	key, h := e.memo.key(v, buf[:0])
	if d, ok := e.memo.get(key, h); ok {
		return d, nil
	}
	d, err := e.eval(ctx, input)
	if err == nil {
		e.memo.put(key, h, d)
	}
	return d, err
}

// eval evaluates the policy on input.
func (e *Engine) eval(ctx context.Context, input any) (Decision, error) {
	opt := rego.EvalInput(input)
	if v, ok := input.(ast.Value); ok {
		opt = rego.EvalParsedInput(v)
	}
	// Per evaluation OPA would otherwise make metrics no one reads, a
	// goroutine that waits for ctx, and the JSON form of the decision,
	// which is read here from the term itself (decision) as that form says.
	opts := [...]rego.EvalOption{opt, rego.EvalMetrics(metrics.NoOp()), rego.EvalGenerateJSON(keepTerm), nil}
	if ctx.Done() == nil {
		opts[3] = rego.EvalExternalCancel(neverCancelled)
	} else {
		c := topdown.NewCancel()
		defer context.AfterFunc(ctx, c.Cancel)()
		opts[3] = rego.EvalExternalCancel(c)
	}
	rs, err := e.query.Eval(ctx, opts[:]...)
	if err != nil {
		return Decision{Reasons: []string{"policy evaluation failed"}},
			api.WrapError(err, api.InternalError, api.EPolicyFailed, "evaluating policy: %v", err)
	}
	if len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return Decision{Reasons: []string{"the policy defines no decision for this call"}}, nil
	}
	t, _ := rs[0].Expressions[0].Value.(*ast.Term)
	return decision(t), nil
}

// The decision's names are interned in OPA's table, so that reading a
// decision makes no terms (ast.InternStringTerm may only be called while
// packages initialise).
func init() {
	ast.InternStringTerm("allow", "requires_approval", "code", "approvers", "reasons")
}

// neverCancelled stands for a context that is never done.
var neverCancelled = topdown.NewCancel()

// keepTerm hands the result on as OPA computed it (rego.EvalGenerateJSON).
func keepTerm(t *ast.Term, _ *rego.EvalContext) (any, error) { return t, nil }

// decision reads the policy's decision from its value, as from its JSON
// form (ast.JSON): numbers are json.Number, sets are arrays.
func decision(t *ast.Term) Decision {
	var obj ast.Object
	if t != nil {
		obj, _ = t.Value.(ast.Object)
	}
	if obj == nil {
		return Decision{Reasons: []string{"the policy's decision is not an object"}}
	}
	field := func(name string) ast.Value {
		if v := obj.Get(ast.InternedTerm(name)); v != nil {
			return v.Value
		}
		return nil
	}
	allow, ok := field("allow").(ast.Boolean)
	if !ok {
		return Decision{Reasons: []string{"the policy's decision has no boolean allow"}}
	}
	d := Decision{Allow: bool(allow)}
	if ra, ok := field("requires_approval").(ast.Boolean); ok {
		d.RequiresApproval = bool(ra)
	}
	if c, ok := field("code").(ast.String); ok {
		d.Code = string(c)
	}
	if n, ok := field("approvers").(ast.Number); ok {
		if i, err := json.Number(n).Int64(); err == nil && i > 1 && i <= maxApprovers {
			d.Approvers = int(i)
		}
	}
	switch rs := field("reasons").(type) {
	case *ast.Array:
		for i := range rs.Len() {
			if s, ok := rs.Elem(i).Value.(ast.String); ok {
				d.Reasons = append(d.Reasons, string(s))
			}
		}
	case ast.Set:
		if all, err := ast.JSON(rs); err == nil {
			for _, r := range all.([]any) {
				if s, ok := r.(string); ok {
					d.Reasons = append(d.Reasons, s)
				}
			}
		}
	}
	if !d.Allow && len(d.Reasons) == 0 {
		d.Reasons = []string{"denied by policy"}
	}
	return d
}
