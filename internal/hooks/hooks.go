// Package hooks holds toolgate's declarative hooks: what happens when a call
// is denied, fails, times out or overspends. A hook names the outcome that
// fires it (a trigger, or a custom CEL condition), and an action: retry,
// retry_with_fallback, continue, skip, fail or abort.
//
// Hooks are declared in a tool's manifest and in a tenant's hook set (KV,
// `toolgate hooks push`); both take the form of schemas.HookSet. Parse checks
// a set against that schema and compiles every condition and template, so a
// hook that cannot run is refused where it is registered, with the position
// of the fault. Decide, called by the audit stage once an invocation's
// terminal outcome is known, picks the first hook that matches: the
// manifest's in order, then the tenant's. Conditions run with a CEL cost
// limit and have no side effects; one that fails at run time counts as false
// and is reported, never fatal.
package hooks

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/schemas"
)

// Triggers: the terminal outcome classes a hook fires on. Classify maps an
// ended invocation to one.
const (
	OnPermissionDenied = "permission_denied"
	OnTimeout          = "timeout"
	OnFailure          = "failure"
	OnBudgetExceeded   = "budget_exceeded"
	OnRateLimited      = "rate_limited"
	OnCircuitOpen      = "circuit_open"
	// OnCustom fires on any ended invocation, success included, whose
	// condition holds.
	OnCustom = "custom"
)

// Actions.
const (
	ActionRetry    = "retry"
	ActionFallback = "retry_with_fallback"
	ActionContinue = "continue"
	ActionSkip     = "skip"
	ActionFail     = "fail"
	ActionAbort    = "abort"
)

// Sources of a hook.
const (
	SourceManifest = "manifest"
	SourceTenant   = "tenant"
)

// MaxDepth bounds a chain of invocations started by hooks: an invocation at
// this depth starts no other; a hook that would is refused with EHookLimit.
const MaxDepth = 4

// CostLimit bounds the CEL cost of evaluating one condition (the unit is
// CEL's: roughly one per operation, one per element a macro visits).
const CostLimit = 10_000

// maxRendered bounds the parameters a template renders.
const maxRendered = 64 << 10

// Spec is one hook as declared.
type Spec struct {
	Name        string    `json:"name,omitempty"`
	On          string    `json:"on"`
	Condition   string    `json:"condition,omitempty"`
	Action      string    `json:"action"`
	MaxAttempts int       `json:"max_attempts,omitempty"`
	Fallback    *Fallback `json:"fallback,omitempty"`
	// Tools limits a tenant hook to the tool ids matching one of these
	// glob patterns (path.Match); empty means every tool.
	Tools []string `json:"tools,omitempty"`
}

// Fallback is the call a retry_with_fallback hook makes instead.
type Fallback struct {
	ToolID      string          `json:"tool_id"`
	ToolVersion string          `json:"tool_version,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// Starts reports whether the hook's action starts a linked invocation.
func (s Spec) Starts() bool { return s.Action == ActionRetry || s.Action == ActionFallback }

// Attempts is how many consecutive invocations the hook may start along one
// chain.
func (s Spec) Attempts() int { return max(s.MaxAttempts, 1) }

// Set is a compiled list of hooks from one source.
type Set struct {
	Source string
	Specs  []Spec
	progs  []cel.Program // nil where a hook has no condition
}

// Doc is the document form of a hook set.
type Doc struct {
	Hooks []Spec `json:"hooks"`
}

// Parse checks doc ({"hooks": [...]}) against schemas.HookSet and compiles
// it. Every failure is an invalid_parameters error with E-code EHookInvalid,
// whose field errors point into doc (/hooks/0/condition).
func Parse(doc []byte, source string) (*Set, error) {
	fields, err := schemas.Validate(schemas.HookSet(), doc)
	if err != nil {
		return nil, api.WrapError(err, api.InvalidParameters, api.EHookInvalid, "hooks: %v", err)
	}
	if len(fields) > 0 {
		return nil, api.NewError(api.InvalidParameters, api.EHookInvalid, "hooks do not match the hook set schema").WithFields(fields)
	}
	var d Doc
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, api.WrapError(err, api.InvalidParameters, api.EHookInvalid, "decoding hooks: %v", err)
	}
	return Compile(d.Hooks, source)
}

// Compile compiles specs that already match the schema: conditions, templates
// and the rules the schema cannot say.
func Compile(specs []Spec, source string) (*Set, error) {
	s := &Set{Source: source, Specs: slices.Clone(specs), progs: make([]cel.Program, len(specs))}
	var fields []api.FieldError
	bad := func(i int, field, format string, args ...any) {
		loc := fmt.Sprintf("/hooks/%d", i)
		if field != "" {
			loc += "/" + field
		}
		fields = append(fields, api.FieldError{Location: loc, Message: fmt.Sprintf(format, args...)})
	}
	names := map[string]bool{}
	for i := range s.Specs {
		h := &s.Specs[i]
		if h.Name == "" {
			h.Name = fmt.Sprintf("%s-%d", h.On, i)
		}
		if names[h.Name] {
			bad(i, "name", "name %q is used by an earlier hook", h.Name)
		}
		names[h.Name] = true
		if h.On == OnCustom && h.Condition == "" {
			bad(i, "condition", "a custom hook needs a condition")
		}
		if (h.Action == ActionFallback) != (h.Fallback != nil) {
			bad(i, "fallback", "fallback is required by, and only allowed with, action retry_with_fallback")
		}
		if h.MaxAttempts > 0 && !h.Starts() {
			bad(i, "max_attempts", "max_attempts applies only to retry and retry_with_fallback")
		}
		if len(h.Tools) > 0 && source != SourceTenant {
			bad(i, "tools", "tools applies only to a tenant's hooks (a manifest's hooks are its own)")
		}
		for j, p := range h.Tools {
			if _, err := path.Match(p, ""); err != nil {
				bad(i, fmt.Sprintf("tools/%d", j), "pattern %q: %v", p, err)
			}
		}
		if h.Condition != "" {
			prg, err := compileCondition(h.Condition)
			if err != nil {
				bad(i, "condition", "%v", err)
			}
			s.progs[i] = prg
		}
		if h.Fallback != nil && len(h.Fallback.Parameters) > 0 {
			if err := checkTemplates(h.Fallback.Parameters); err != nil {
				bad(i, "fallback/parameters", "%v", err)
			}
		}
	}
	if len(fields) > 0 {
		return nil, api.NewError(api.InvalidParameters, api.EHookInvalid, "%s hooks do not compile: %s %s",
			source, fields[0].Location, fields[0].Message).WithFields(fields)
	}
	return s, nil
}

// Variables is what conditions and templates see.
var Variables = []string{"invocation", "status", "trigger", "error", "result", "usage", "manifest"}

var celEnv = sync.OnceValues(func() (*cel.Env, error) {
	obj := cel.MapType(cel.StringType, cel.DynType)
	return cel.NewEnv(
		cel.Variable("invocation", obj),
		cel.Variable("status", cel.StringType),
		cel.Variable("trigger", cel.StringType),
		cel.Variable("error", obj),
		cel.Variable("result", cel.DynType),
		cel.Variable("usage", obj),
		cel.Variable("manifest", obj),
		cel.CrossTypeNumericComparisons(true),
		cel.ParserExpressionSizeLimit(2048),
		cel.ParserRecursionLimit(64),
	)
})

// compileCondition compiles expr as a boolean CEL expression; the error
// names the line and column of the first fault.
func compileCondition(expr string) (cel.Program, error) {
	env, err := celEnv()
	if err != nil {
		return nil, err
	}
	ast, iss := env.Compile(expr)
	if iss != nil && iss.Err() != nil {
		if errs := iss.Errors(); len(errs) > 0 {
			loc := errs[0].Location
			return nil, fmt.Errorf("line %d, column %d: %s", loc.Line(), loc.Column()+1, errs[0].Message)
		}
		return nil, iss.Err()
	}
	if t := ast.OutputType(); t != cel.BoolType && t != cel.DynType {
		return nil, fmt.Errorf("line 1, column 1: the condition is of type %s, not bool", t)
	}
	return env.Program(ast, cel.CostLimit(CostLimit), cel.InterruptCheckFrequency(64))
}

// Outcome is what a terminal invocation looks like to a hook: the variables
// of conditions and templates.
type Outcome struct {
	// Invocation: id, tenant, tool_id, tool_version, parameters,
	// agent_did, session_id, stage, depth, attempt, parent, root.
	Invocation map[string]any
	Status     string
	Trigger    string
	// Error: code, e_code, message, retryable, details; empty strings and
	// false when the call succeeded.
	Error  map[string]any
	Result any
	// Usage: the session's calls, runtime_ms, cost, tokens,
	// consecutive_failures.
	Usage map[string]any
	// Manifest: id, version, kind, category, tags, risk_level,
	// side_effects, idempotent.
	Manifest map[string]any
}

func (o Outcome) vars() map[string]any {
	nz := func(m map[string]any) map[string]any {
		if m == nil {
			return map[string]any{}
		}
		return m
	}
	return map[string]any{
		"invocation": nz(o.Invocation), "status": o.Status, "trigger": o.Trigger,
		"error": nz(o.Error), "result": o.Result, "usage": nz(o.Usage), "manifest": nz(o.Manifest),
	}
}

// Classify maps an ended invocation's status and error to its trigger. ok
// is false for outcomes no hook may act on: cancelled calls, refusals of a
// duplicate or an unlinked request, calls of an aborted session, and ends
// a hook already decided (a skip, the depth limit). A success has no
// trigger but is eligible: custom hooks see it.
func Classify(status api.Status, e *api.Error) (trigger string, ok bool) {
	if status == api.StatusSuccess {
		return "", true
	}
	if status == api.StatusCancelled || e == nil {
		return "", false
	}
	switch e.ECode {
	case api.EDuplicateInvocation, api.EPoisonMessage, api.ESessionAborted, api.EHookLimit, api.EHookSkipped, api.ELinkRefused:
		return "", false
	case api.EBudgetExhausted:
		return OnBudgetExceeded, true
	}
	switch {
	case e.Code == api.RateLimitExceeded:
		return OnRateLimited, true
	case e.Code == api.CircuitBreakerOpen:
		return OnCircuitOpen, true
	case status == api.StatusTimeout:
		return OnTimeout, true
	case status == api.StatusPermissionDenied:
		return OnPermissionDenied, true
	}
	return OnFailure, true
}

// Match is the hook Decide chose.
type Match struct {
	Spec   Spec
	Source string
	// Attempt is the attempt number the invocation it starts will carry.
	Attempt int
}

// Decide returns the first hook of sets (in order) that applies to toolID
// and matches o, or nil. link is the decided invocation's own link (nil
// for a caller's request): a retry or fallback hook that has started its
// max_attempts along the chain is passed over. errs lists conditions that
// failed at run time, each taken as false.
func Decide(ctx context.Context, o Outcome, toolID string, link *api.Link, sets ...*Set) (m *Match, errs []string) {
	vars := o.vars()
	for _, s := range sets {
		if s == nil {
			continue
		}
		for i, h := range s.Specs {
			if h.On != OnCustom && h.On != o.Trigger {
				continue
			}
			if !appliesTo(h.Tools, toolID) {
				continue
			}
			attempt := 1
			if h.Starts() && link != nil && link.Hook == h.Name {
				attempt = link.Attempt + 1
			}
			if attempt > h.Attempts() {
				continue
			}
			if prg := s.progs[i]; prg != nil {
				ok, err := eval(ctx, prg, vars)
				if err != nil {
					errs = append(errs, fmt.Sprintf("%s hook %s: %v", s.Source, h.Name, err))
					continue
				}
				if !ok {
					continue
				}
			}
			return &Match{Spec: h, Source: s.Source, Attempt: attempt}, errs
		}
	}
	return nil, errs
}

func appliesTo(patterns []string, toolID string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if ok, _ := path.Match(p, toolID); ok {
			return true
		}
	}
	return false
}

func eval(ctx context.Context, prg cel.Program, vars map[string]any) (bool, error) {
	out, _, err := prg.ContextEval(ctx, vars)
	if err != nil {
		return false, err
	}
	b, ok := out.Value().(bool)
	if !ok {
		return false, fmt.Errorf("the condition gave %v, not a bool", out.Value())
	}
	return b, nil
}

// Render fills the ${...} templates of params from o. A string that is one
// template takes the variable's JSON value; a template inside a longer
// string is replaced by the value's text (JSON for objects and arrays). A
// variable that does not exist becomes null, or the empty string inside a
// longer string, and is listed in missing.
func Render(params json.RawMessage, o Outcome) (out json.RawMessage, missing []string, err error) {
	var doc any
	if err := json.Unmarshal(params, &doc); err != nil {
		return nil, nil, fmt.Errorf("fallback parameters: %w", err)
	}
	vars := o.vars()
	doc = walkStrings(doc, func(s string) any {
		refs := templateRefs(s)
		if len(refs) == 0 {
			return s
		}
		if len(refs) == 1 && refs[0].start == 0 && refs[0].end == len(s) {
			v, ok := lookup(vars, refs[0].path)
			if !ok {
				missing = append(missing, refs[0].path)
			}
			return v
		}
		var b strings.Builder
		last := 0
		for _, r := range refs {
			b.WriteString(s[last:r.start])
			v, ok := lookup(vars, r.path)
			if !ok {
				missing = append(missing, r.path)
			}
			b.WriteString(text(v))
			last = r.end
		}
		b.WriteString(s[last:])
		return b.String()
	})
	out, err = json.Marshal(doc)
	if err != nil {
		return nil, missing, err
	}
	if len(out) > maxRendered {
		return nil, missing, fmt.Errorf("rendered fallback parameters are %d bytes, over %d", len(out), maxRendered)
	}
	return out, missing, nil
}

func text(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	}
	b, _ := json.Marshal(v)
	return string(bytes.TrimSpace(b))
}

func walkStrings(v any, fn func(string) any) any {
	switch v := v.(type) {
	case string:
		return fn(v)
	case map[string]any:
		for k, x := range v {
			v[k] = walkStrings(x, fn)
		}
	case []any:
		for i, x := range v {
			v[i] = walkStrings(x, fn)
		}
	}
	return v
}

type ref struct {
	start, end int
	path       string
}

// templateRefs finds the ${path} references in s.
func templateRefs(s string) []ref {
	var out []ref
	for i := 0; i < len(s); {
		j := strings.Index(s[i:], "${")
		if j < 0 {
			break
		}
		start := i + j
		k := strings.IndexByte(s[start:], '}')
		if k < 0 {
			break
		}
		out = append(out, ref{start: start, end: start + k + 1, path: strings.TrimSpace(s[start+2 : start+k])})
		i = start + k + 1
	}
	return out
}

// checkTemplates refuses a template that names no variable.
func checkTemplates(params json.RawMessage) error {
	var doc any
	if err := json.Unmarshal(params, &doc); err != nil {
		return err
	}
	var bad error
	walkStrings(doc, func(s string) any {
		for _, r := range templateRefs(s) {
			root, _, _ := strings.Cut(r.path, ".")
			if bad == nil && !slices.Contains(Variables, root) {
				bad = fmt.Errorf("template ${%s} at byte %d names no variable (known: %s)", r.path, r.start, strings.Join(Variables, ", "))
			}
		}
		return s
	})
	return bad
}

// lookup follows a dotted path (map keys, array indices) in vars.
func lookup(vars map[string]any, p string) (any, bool) {
	var cur any = vars
	for _, seg := range strings.Split(p, ".") {
		switch c := cur.(type) {
		case map[string]any:
			v, ok := c[seg]
			if !ok {
				return nil, false
			}
			cur = v
		case []any:
			var i int
			if _, err := fmt.Sscanf(seg, "%d", &i); err != nil || i < 0 || i >= len(c) || fmt.Sprint(i) != seg {
				return nil, false
			}
			cur = c[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

// Tenants holds every tenant's compiled hook set; a watch on the hooks
// bucket keeps it current. It is safe for concurrent use.
type Tenants struct{ m sync.Map }

// Put sets tenant's hooks; nil removes them.
func (t *Tenants) Put(tenant string, s *Set) {
	if s == nil {
		t.m.Delete(tenant)
		return
	}
	t.m.Store(tenant, s)
}

// Get returns tenant's hooks, nil when it has none (or t is nil).
func (t *Tenants) Get(tenant string) *Set {
	if t == nil {
		return nil
	}
	s, _ := t.m.Load(tenant)
	set, _ := s.(*Set)
	return set
}
