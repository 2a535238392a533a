// Package authorize is the second stage. No tool runs unless a valid,
// unexpired, unrevoked capability token grants it to this tenant and agent,
// the policy allows it, a human approved it when the policy asks for that,
// and its session is within budget.
//
// The order is fixed: the token first (nothing else is read for a forged
// one), then the policy over the request, the manifest, the verified claims
// and the session's usage, then the approval gate, and last the budget
// reservation, which is the only write. A token tree without a budget has
// no usage read or written: its calls are counted nowhere.
package authorize

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/hosts"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/stages/execute/httptool"
	"github.com/toolgate/toolgate/subjects"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"
)

// DefaultApprovalTimeout is how long a call waits for a human by default.
const DefaultApprovalTimeout = 15 * time.Minute

// Store is the state the stage reads and writes.
type Store interface {
	Usage(ctx context.Context, tenant, session string) (kvstore.Usage, error)
	// RecentUsage may answer from what this process last wrote or read.
	RecentUsage(ctx context.Context, tenant, session string) (kvstore.Usage, error)
	UpdateUsage(ctx context.Context, tenant, session string, change func(*kvstore.Usage) error) (kvstore.Usage, error)
	Approval(ctx context.Context, tenant, id string) (kvstore.Approval, error)
	RequestApproval(ctx context.Context, a kvstore.Approval) (kvstore.Approval, bool, error)
	SetStatus(ctx context.Context, rec api.Record) (api.Record, bool, error)
}

// HookDecisions reads the decision a hook recorded on an ended invocation
// (*kvstore.Store).
type HookDecisions interface {
	HookDecisionOf(ctx context.Context, tenant, id string) (kvstore.HookDecision, error)
}

// Config wires an Authorizer.
type Config struct {
	Registry *tools.Registry
	Policy   *policy.Engine
	Verifier *token.Verifier
	Revoked  *token.Revocations
	Store    Store
	// Decisions holds the hook decisions that admit the invocations hooks
	// start (retries, fallbacks); nil refuses every linked request.
	Decisions HookDecisions
	// ApprovalTimeout is how long a parked call waits before it ends denied.
	ApprovalTimeout time.Duration
	// Sealer, when set, signs each admitted call's decision into the
	// envelope (internal/seal); execute runs only sealed calls.
	Sealer Sealer
	// ApprovalProof, when set, verifies that an approved call's approval
	// record carries an operator's signed decision; nil trusts the record
	// (a bus without authentication).
	ApprovalProof func(a kvstore.Approval, requestDigest string) error
	// Aborted holds the sessions abort hooks ended: the trees without a
	// budget read no usage, and a call given a leased budget call writes
	// none, so neither would find the mark there; nil: none.
	Aborted *kvstore.Aborts
	// TokenSeal, when set, opens the sealed capability token validate hands
	// on (*seal.Tokens); a raw token then is refused: only validate puts a
	// token on this hop.
	TokenSeal TokenOpener
	// SignPrincipal, when set, signs the principal authorize records in
	// the envelope (envelope.PrincipalText), and DecisionSigned checks
	// audit's signature over a hook decision (kvstore.DecisionText) before
	// a linked request is admitted as its child. Both are set on a bus
	// where every role signs (seal.Signer, seal.Messages).
	SignPrincipal  func(text []byte) string
	DecisionSigned func(text []byte, sig string) bool
	Now            func() time.Time
}

// TokenOpener opens a sealed capability token.
type TokenOpener interface {
	Open(sealed string) (string, error)
}

// Sealer signs an admitted invocation's authorization for the resolved tool
// id and version, valid until expires (*seal.Sealer).
type Sealer interface {
	Seal(inv *envelope.Invocation, toolID, toolVersion string, expires time.Time) error
}

// Authorizer implements the authorize stage.
type Authorizer struct {
	cfg    Config
	engine atomic.Pointer[policy.Engine]
	tools  manifestForms
	claims astValues[[32]byte] // at most maxCachedTokens
	leases *leases
}

var _ stages.Stage = (*Authorizer)(nil)

// New returns an Authorizer.
func New(cfg Config) *Authorizer {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ApprovalTimeout <= 0 {
		cfg.ApprovalTimeout = DefaultApprovalTimeout
	}
	if cfg.Revoked == nil {
		cfg.Revoked = new(token.Revocations)
	}
	a := &Authorizer{cfg: cfg, leases: newLeases(cfg.Store, cfg.Now)}
	a.claims.max = maxCachedTokens
	a.engine.Store(cfg.Policy)
	return a
}

// Release returns the calls this stage leased and has not used to their
// budgets; call it when the stage stops.
func (a *Authorizer) Release(ctx context.Context) error { return a.leases.release(ctx) }

// SetSealer makes the stage seal every call it admits (Config.Sealer).
func (a *Authorizer) SetSealer(s Sealer) { a.cfg.Sealer = s }

// SetApprovalProof makes the stage verify approvals (Config.ApprovalProof).
func (a *Authorizer) SetApprovalProof(f func(kvstore.Approval, string) error) {
	a.cfg.ApprovalProof = f
}

// SetPolicy replaces the policy for every later evaluation.
func (a *Authorizer) SetPolicy(e *policy.Engine) { a.engine.Store(e) }

// Input is what the policy sees as `input`.
type Input struct {
	Request   *api.Request    `json:"request"`
	Tool      *tools.Manifest `json:"tool"`
	Claims    *token.Claims   `json:"claims"`
	Usage     kvstore.Usage   `json:"usage"`
	Resources Resources       `json:"resources"`
	Derived   Derived         `json:"derived"`
	Approval  *ApprovalInput  `json:"approval,omitempty"`
	Tenant    string          `json:"tenant"`
	Time      string          `json:"time"`
}

// Resources are what a call needs: the manifest's permissions and the
// paths among its parameters.
type Resources struct {
	Paths       []PathNeed `json:"paths"`
	Hosts       []HostNeed `json:"hosts"`
	Credentials []string   `json:"credentials"`
}

// PathNeed is a path under the file root and the access needed.
type PathNeed struct {
	Path string `json:"path"`
	Mode string `json:"mode"`
}

// HostNeed is a host and port (0: any) a call connects to.
type HostNeed struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}

// Derived are facts about the claims computed in Go, where pattern matching
// has one implementation.
type Derived struct {
	PreApproved bool            `json:"pre_approved"`
	HostGranted map[string]bool `json:"host_granted"`
}

// ApprovalInput is the human decision, when one was asked for.
type ApprovalInput struct {
	State     string `json:"state"`
	DecidedBy string `json:"decided_by,omitempty"`
}

// ApprovalRequested is the data of the approval-requested audit event.
type ApprovalRequested struct {
	envelope.AuditRecord
	Reasons     []string  `json:"reasons"`
	RiskLevel   string    `json:"risk_level"`
	SideEffects []string  `json:"side_effects,omitempty"`
	Reversible  bool      `json:"reversible"`
	Deadline    time.Time `json:"deadline"`
}

// Process implements stages.Stage.
func (a *Authorizer) Process(ctx context.Context, inv *envelope.Invocation) ([]stages.Output, error) {
	req := inv.Request
	m, err := a.cfg.Registry.Resolve(req.ToolID, req.ToolVersion)
	if err != nil {
		return nil, err
	}
	rawToken := req.CapabilityToken
	if a.cfg.TokenSeal != nil && rawToken != "" {
		if rawToken, err = a.cfg.TokenSeal.Open(rawToken); err != nil {
			return nil, api.NewError(api.PermissionDenied, api.ETokenInvalid,
				"the capability token on this hop was not sealed by validate: %v", err)
		}
	}
	var claims *token.Claims
	if req.Link != nil {
		claims, err = a.linked(ctx, inv)
	} else {
		claims, err = a.cfg.Verifier.Verify(rawToken)
	}
	if err != nil {
		return nil, err
	}
	if id, revoked := a.cfg.Revoked.Revoked(claims); revoked {
		return nil, api.NewError(api.PermissionDenied, api.ETokenRevoked, "capability token %s is revoked", id)
	}
	if raw, err := json.Marshal(claims); err == nil {
		inv.Principal = &envelope.Principal{Session: token.BudgetKey(claims.Root()), Claims: raw}
		if a.cfg.SignPrincipal != nil {
			inv.Principal.Sig = a.cfg.SignPrincipal(envelope.PrincipalText(inv))
		}
	}
	err = claims.Grants(token.Binding{
		Tenant: inv.Tenant, AgentDID: req.AgentContext.AgentDID, SessionID: req.AgentContext.SessionID,
		ToolID: m.ID, ToolVersion: m.Version,
	})
	if err != nil {
		return nil, err
	}
	// A budget belongs to the token tree, whatever session the caller
	// names: the tree's root id keys it, and a child's own budget is kept
	// beside it under the child's id.
	tree, own := token.BudgetKey(claims.Root()), token.BudgetKey(claims.ID)
	// A tree without a budget has nothing to count against: its calls read
	// and write no usage, so they share no key and never wait on each other.
	metered := claims.Budget != nil || claims.TreeBudget() != nil
	if ab, ok := a.cfg.Aborted.Aborted(inv.Tenant, tree); ok {
		return nil, sessionAborted(ab)
	}
	// A metered call is judged on the usage this process saw last and
	// reserved on exactly that usage; when the usage moved meanwhile (the
	// end of another call charged, another process wrote), it is judged
	// again on a fresh read.
	var approval kvstore.Approval
	var hasApproval bool
	// reserve fills in what a model call may use of the budgets.
	hold := &modelHold{}
	ctx = context.WithValue(ctx, modelHoldKey{}, hold)
	for attempt := 1; ; attempt++ {
		var outs []stages.Output
		var done bool
		approval, hasApproval, outs, done, err = a.decide(ctx, inv, rawToken, m, claims, metered, tree, own, attempt > 1)
		if errors.Is(err, errUsageMoved) {
			if attempt < maxDecisions {
				continue
			}
			return nil, stages.Transient(err, 0)
		}
		if done || err != nil {
			return outs, err
		}
		break
	}
	inv.Authz = &envelope.Authorization{
		TokenID: claims.ID, AgentDID: claims.AgentDID, Session: tree, Reserved: true,
		Unmetered: !metered, Grants: grants(claims),
	}
	if own != tree {
		inv.Authz.TokenBudget = own
	}
	if m.Cost != nil {
		inv.Authz.CostPerCall = m.Cost.PerCall
	}
	inv.Authz.ModelTokens, inv.Authz.ModelCost = hold.tokens, hold.cost
	if hasApproval && approval.State == kvstore.ApprovalApproved {
		inv.Authz.ApprovedBy = approval.DecidedBy
	}
	// Past this stage the token has done its work: what it grants is in
	// inv.Authz. The raw token leaves the envelope, so no later hop, stream
	// or record carries a credential an agent could reuse.
	req.CapabilityToken = ""
	if a.cfg.Sealer != nil {
		// The token's expiry, with room for the verifiers' clock leeway.
		exp := a.cfg.Now().Add(24 * time.Hour)
		if claims.ExpiresAt != nil {
			exp = claims.ExpiresAt.Add(time.Minute)
		}
		if err := a.cfg.Sealer.Seal(inv, m.ID, m.Version, exp); err != nil {
			return nil, api.WrapError(err, api.InternalError, api.EHopUnsealed, "sealing the decision: %v", err)
		}
	}
	return nil, nil
}

// maxDecisions bounds how often one call is judged again because its
// usage moved between the policy's read and the reservation.
const maxDecisions = 4

// errUsageMoved reports a reservation that found the usage the policy
// judged changed since: the call is judged again on a fresh read.
var errUsageMoved = errors.New("the session's usage changed while the call was judged")

// decide evaluates the policy and the approval gate and, for a metered
// call, reserves it. done means Process returns outs and err as they are
// (a parked call, or a refusal).
func (a *Authorizer) decide(ctx context.Context, inv *envelope.Invocation, rawToken string, m *tools.Manifest, claims *token.Claims,
	metered bool, tree, own string, fresh bool) (approval kvstore.Approval, hasApproval bool, outs []stages.Output, done bool, err error) {
	req := inv.Request
	var usage kvstore.Usage
	if metered {
		read := a.cfg.Store.RecentUsage
		if fresh {
			read = a.cfg.Store.Usage
		}
		if usage, err = read(ctx, inv.Tenant, own); err != nil {
			return approval, false, nil, true, stages.Transient(err, 0)
		}
		// The ids it remembers are bookkeeping for redeliveries, not usage;
		// leased calls not yet used are not made, but those this process
		// gave since its lease's write are.
		usage.Reserved, usage.Settled = nil, nil
		usage.Calls, usage.Leases = usage.Made()+a.leases.given(inv.Tenant, own), nil
	}
	in := Input{
		Request: redactToken(req), Tool: m, Claims: cleanGrants(claims), Usage: usage,
		Resources: resources(m, req.Parameters), Tenant: inv.Tenant,
		Time: a.cfg.Now().UTC().Format(time.RFC3339),
	}
	in.Derived = derive(claims, m, in.Resources)
	d, err := a.eval(ctx, in, rawToken)
	if err != nil {
		return approval, false, nil, true, err
	}
	// Only a call the policy wants approved looks for a decision, and the
	// policy then judges again with the decision in its input.
	if d.Allow && d.RequiresApproval {
		approval, err = a.cfg.Store.Approval(ctx, inv.Tenant, inv.ID)
		hasApproval = err == nil
		if err != nil && !errors.Is(err, kvstore.ErrNoApproval) {
			return approval, false, nil, true, stages.Transient(err, 0)
		}
		if hasApproval && approval.State == kvstore.ApprovalApproved && a.cfg.ApprovalProof != nil {
			// The bucket is writable by every stage worker: only an
			// operator's signature makes a record an approval.
			if err := a.cfg.ApprovalProof(approval, envelope.RequestDigest(inv.Request)); err != nil {
				return approval, hasApproval, nil, true, api.WrapError(err, api.PermissionDenied, api.EDeciderUnverified,
					"the approval of %s is not an operator's signed decision: %v", inv.ID, err)
			}
		}
		if hasApproval {
			in.Approval = &ApprovalInput{State: approval.State, DecidedBy: approval.DecidedBy}
			if d, err = a.eval(ctx, in, rawToken); err != nil {
				return approval, hasApproval, nil, true, err
			}
		}
	}
	if !d.Allow {
		return approval, hasApproval, nil, true, denial(d)
	}
	if d.RequiresApproval {
		switch {
		case !hasApproval || approval.State == kvstore.ApprovalPending:
			outs, err := a.park(ctx, inv, m, d)
			return approval, hasApproval, outs, true, err
		case approval.State == kvstore.ApprovalExpired:
			return approval, hasApproval, nil, true, api.NewError(api.PermissionDenied, api.EApprovalExpired, "no one approved the call in time")
		default:
			return approval, hasApproval, nil, true, api.NewError(api.PermissionDenied, api.EApprovalDenied,
				"%s denied the call: %s", approval.DecidedBy, approval.Reason)
		}
	}
	if metered {
		if err := a.reserveTree(ctx, inv, claims, tree, own, m, usage); err != nil {
			return approval, hasApproval, nil, !errors.Is(err, errUsageMoved), err
		}
	}
	return approval, hasApproval, nil, false, nil
}

// linked returns the principal of an invocation a hook started: the
// verified claims of the invocation whose end fired the hook, provided the
// decision recorded there describes this request exactly (id, tool,
// version, parameters, agent, link) and the request carries no token of its
// own. The claims must still be unexpired; policy, approval and budget then
// judge the call like any other.
func (a *Authorizer) linked(ctx context.Context, inv *envelope.Invocation) (*token.Claims, error) {
	req := inv.Request
	refuse := func(format string, args ...any) error {
		return api.NewError(api.PermissionDenied, api.ELinkRefused, "link to %s refused: "+format,
			append([]any{req.Link.Parent}, args...)...)
	}
	if req.CapabilityToken != "" {
		return nil, refuse("a linked request carries no token of its own")
	}
	if a.cfg.Decisions == nil {
		return nil, refuse("hooks are not enabled on this worker")
	}
	d, err := a.cfg.Decisions.HookDecisionOf(ctx, inv.Tenant, req.Link.Parent)
	if errors.Is(err, kvstore.ErrNoHookDecision) {
		return nil, refuse("no hook decided to start it")
	}
	if err != nil {
		return nil, stages.Transient(err, 0)
	}
	c := d.Child
	if c == nil || c.ID != inv.ID {
		return nil, refuse("the hook started another invocation")
	}
	if !sameChild(c.Request, *req) {
		return nil, refuse("the request differs from the one the hook decided")
	}
	if a.cfg.DecisionSigned != nil {
		text, err := kvstore.DecisionText(d)
		if err != nil || !a.cfg.DecisionSigned(text, d.Sig) {
			return nil, api.NewError(api.PermissionDenied, api.ERecordUnsigned,
				"link to %s refused: the hook's decision is not signed by the audit stage", req.Link.Parent)
		}
	}
	if len(c.Claims) == 0 {
		return nil, refuse("the parent had no verified capability token")
	}
	claims := new(token.Claims)
	if err := json.Unmarshal(c.Claims, claims); err != nil {
		return nil, refuse("undecodable claims: %v", err)
	}
	if exp := claims.ExpiresAt; exp == nil || !a.cfg.Now().Before(exp.Time) {
		return nil, api.NewError(api.PermissionDenied, api.ETokenExpired, "the capability token of %s has expired", req.Link.Parent)
	}
	return claims, nil
}

// sameChild reports whether req asks for what the hook decided.
func sameChild(want, req api.Request) bool {
	if want.ToolID != req.ToolID || want.ToolVersion != req.ToolVersion || want.AgentContext != req.AgentContext ||
		want.Link == nil || *want.Link != *req.Link {
		return false
	}
	return compactJSON(want.Parameters) == compactJSON(req.Parameters)
}

func compactJSON(b []byte) string {
	var v any
	if len(b) == 0 || json.Unmarshal(b, &v) != nil {
		return "{}"
	}
	out, _ := json.Marshal(v) // map keys sorted
	return string(out)
}

func (a *Authorizer) eval(ctx context.Context, in Input, rawToken string) (policy.Decision, error) {
	input, err := a.policyInput(in, rawToken)
	if err != nil {
		return policy.Decision{}, api.WrapError(err, api.InternalError, api.EPolicyFailed, "building policy input: %v", err)
	}
	return a.engine.Load().Eval(ctx, input)
}

// policyInput is in in the form OPA evaluates: the ast.Value of its JSON
// encoding (TestPolicyInputIsItsJSON holds it to that). The manifest's
// part, the largest and the same on every call of a tool version, is
// converted once per manifest; the claims' part, the same on every call
// with one token, once per token (rawToken; linked requests, which have
// none, convert theirs every time). The request goes through its JSON
// encoding; the small fixed-shape parts are built directly.
func (a *Authorizer) policyInput(in Input, rawToken string) (ast.Value, error) {
	req, err := astValue(in.Request)
	if err != nil {
		return nil, err
	}
	var tool ast.Value = ast.Null{}
	if m := in.Tool; m != nil {
		if tool, err = a.tools.value(m); err != nil {
			return nil, err
		}
	}
	var claims ast.Value
	if c := in.Claims; rawToken != "" && c != nil {
		claims, err = a.claims.value(sha256.Sum256([]byte(rawToken)), func() (ast.Value, error) { return astValue(c) })
	} else {
		claims, err = astValue(in.Claims)
	}
	if err != nil {
		return nil, err
	}
	usage, err := usageTerm(in.Usage)
	if err != nil {
		return nil, err
	}
	terms := [][2]*ast.Term{
		ast.Item(ast.InternedTerm("request"), ast.NewTerm(req)),
		ast.Item(ast.InternedTerm("tool"), ast.NewTerm(tool)),
		ast.Item(ast.InternedTerm("claims"), ast.NewTerm(claims)),
		ast.Item(ast.InternedTerm("usage"), usage),
		ast.Item(ast.InternedTerm("resources"), resourcesTerm(in.Resources)),
		ast.Item(ast.InternedTerm("derived"), derivedTerm(in.Derived)),
		ast.Item(ast.InternedTerm("tenant"), ast.StringTerm(in.Tenant)),
		ast.Item(ast.InternedTerm("time"), ast.StringTerm(in.Time)),
	}
	if ap := in.Approval; ap != nil {
		fields := [][2]*ast.Term{ast.Item(ast.InternedTerm("state"), ast.StringTerm(ap.State))}
		if ap.DecidedBy != "" {
			fields = append(fields, ast.Item(ast.InternedTerm("decided_by"), ast.StringTerm(ap.DecidedBy)))
		}
		terms = append(terms, ast.Item(ast.InternedTerm("approval"), ast.ObjectTerm(fields...)))
	}
	return ast.NewObject(terms...), nil
}

// zeroUsage is the policy form of an empty usage (every unmetered call's).
var zeroUsage = func() *ast.Term {
	v, err := astValue(kvstore.Usage{})
	if err != nil {
		panic(err)
	}
	return ast.NewTerm(v)
}()

// usageTerm is u's JSON encoding as a term, built directly for the usage
// a policy is given (its id lists and leases left out): a metered call
// converts one on every call.
func usageTerm(u kvstore.Usage) (*ast.Term, error) {
	if reflect.ValueOf(u).IsZero() {
		return zeroUsage, nil
	}
	if u.Reserved != nil || u.Settled != nil || u.Leases != nil {
		v, err := astValue(u)
		return ast.NewTerm(v), err
	}
	cost, err := json.Marshal(u.Cost)
	if err != nil {
		return nil, err
	}
	items := [][2]*ast.Term{
		ast.Item(ast.InternedTerm("calls"), intTerm(u.Calls)),
		ast.Item(ast.InternedTerm("runtime_ms"), intTerm(u.RuntimeMS)),
		ast.Item(ast.InternedTerm("cost"), ast.NumberTerm(json.Number(cost))),
		ast.Item(ast.InternedTerm("tokens"), intTerm(u.Tokens)),
		ast.Item(ast.InternedTerm("consecutive_failures"), intTerm(u.ConsecutiveFailures)),
	}
	if !u.UpdatedAt.IsZero() {
		items = append(items, ast.Item(ast.InternedTerm("updated_at"), timeTerm(u.UpdatedAt)))
	}
	if !u.StartedAt.IsZero() {
		items = append(items, ast.Item(ast.InternedTerm("started_at"), timeTerm(u.StartedAt)))
	}
	if ab := u.Aborted; ab != nil {
		items = append(items, ast.Item(ast.InternedTerm("aborted"), ast.ObjectTerm(
			ast.Item(ast.InternedTerm("invocation_id"), ast.StringTerm(ab.InvocationID)),
			ast.Item(ast.InternedTerm("hook"), ast.StringTerm(ab.Hook)),
			ast.Item(ast.InternedTerm("at"), timeTerm(ab.At)))))
	}
	return ast.ObjectTerm(items...), nil
}

func intTerm(n int64) *ast.Term { return ast.NumberTerm(json.Number(strconv.FormatInt(n, 10))) }

// timeTerm is t as encoding/json writes it.
func timeTerm(t time.Time) *ast.Term { return ast.StringTerm(t.Format(time.RFC3339Nano)) }

// resourcesTerm is r's JSON encoding as a term.
func resourcesTerm(r Resources) *ast.Term {
	var paths, hosts, creds []*ast.Term
	for _, p := range r.Paths {
		paths = append(paths, ast.ObjectTerm(ast.Item(ast.InternedTerm("path"), ast.StringTerm(p.Path)),
			ast.Item(ast.InternedTerm("mode"), ast.StringTerm(p.Mode))))
	}
	for _, h := range r.Hosts {
		hosts = append(hosts, ast.ObjectTerm(ast.Item(ast.InternedTerm("host"), ast.StringTerm(h.Host)),
			ast.Item(ast.InternedTerm("port"), ast.IntNumberTerm(h.Port))))
	}
	for _, c := range r.Credentials {
		creds = append(creds, ast.StringTerm(c))
	}
	return ast.ObjectTerm(
		ast.Item(ast.InternedTerm("paths"), arrayTerm(r.Paths == nil, paths)),
		ast.Item(ast.InternedTerm("hosts"), arrayTerm(r.Hosts == nil, hosts)),
		ast.Item(ast.InternedTerm("credentials"), arrayTerm(r.Credentials == nil, creds)))
}

// derivedTerm is d's JSON encoding as a term.
func derivedTerm(d Derived) *ast.Term {
	granted := ast.NullTerm()
	if d.HostGranted != nil {
		items := make([][2]*ast.Term, 0, len(d.HostGranted))
		for h, ok := range d.HostGranted {
			items = append(items, ast.Item(ast.StringTerm(h), ast.BooleanTerm(ok)))
		}
		granted = ast.ObjectTerm(items...)
	}
	return ast.ObjectTerm(ast.Item(ast.InternedTerm("pre_approved"), ast.BooleanTerm(d.PreApproved)),
		ast.Item(ast.InternedTerm("host_granted"), granted))
}

// arrayTerm is an array, or null for a nil slice, as encoding/json writes.
func arrayTerm(null bool, elems []*ast.Term) *ast.Term {
	if null {
		return ast.NullTerm()
	}
	return ast.ArrayTerm(elems...)
}

// astValue is v's JSON encoding as an ast.Value.
func astValue(v any) (ast.Value, error) {
	p, err := plain(v)
	if err != nil {
		return nil, err
	}
	return ast.InterfaceToValue(p)
}

// maxCachedTokens bounds the tokens whose policy form is kept; past it the
// cache starts again empty. A token's claims' form weighs about a kilobyte.
const maxCachedTokens = 4096

// astValues keeps policy forms of values that do not change by a key that
// names them: the SHA-256 of a raw token (its verified claims).
type astValues[K comparable] struct {
	mu  sync.Mutex
	m   map[K]ast.Value
	max int
}

func (c *astValues[K]) value(k K, make func() (ast.Value, error)) (ast.Value, error) {
	c.mu.Lock()
	v, ok := c.m[k]
	c.mu.Unlock()
	if ok {
		return v, nil
	}
	v, err := make()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= c.max {
		c.m = map[K]ast.Value{}
	}
	c.m[k] = v
	c.mu.Unlock()
	return v, nil
}

// manifestForms keeps the policy form of each manifest for as long as the
// manifest lives. The registry hands out one *tools.Manifest per registered
// version and replaces, never changes, it when the version is registered
// again; the form of a replaced or deleted one goes when the collector
// takes the manifest. So every registered tool's manifest is converted
// once, however many are called, at a memory cost in proportion to the
// registry's own.
type manifestForms struct {
	mu sync.Mutex
	m  map[weak.Pointer[tools.Manifest]]ast.Value
}

func (c *manifestForms) value(m *tools.Manifest) (ast.Value, error) {
	k := weak.Make(m)
	c.mu.Lock()
	v, ok := c.m[k]
	c.mu.Unlock()
	if ok {
		return v, nil
	}
	v, err := astValue(m)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok {
		if c.m == nil {
			c.m = map[weak.Pointer[tools.Manifest]]ast.Value{}
		}
		c.m[k] = v
		runtime.AddCleanup(m, c.drop, k)
	}
	return v, nil
}

func (c *manifestForms) drop(k weak.Pointer[tools.Manifest]) {
	c.mu.Lock()
	delete(c.m, k)
	c.mu.Unlock()
}

// denial turns a policy's refusal into the error of its code.
func denial(d policy.Decision) error {
	code, ecode := api.PermissionDenied, api.EPolicyDenied
	switch d.Code {
	case api.EFilesystemDenied, api.ENetworkDenied, api.ECredentialDenied, api.ENotGranted:
		ecode = d.Code
	case api.EBudgetExhausted:
		code, ecode = api.ResourceExhausted, d.Code
	}
	return api.NewError(code, ecode, "denied by policy: %s", strings.Join(d.Reasons, "; ")).WithDetail("reasons", d.Reasons)
}

// park records a pending approval and leaves the invocation outside the
// pipeline until a decision resumes or ends it. Redelivery finds the stored
// approval and parks again with the same message ids.
func (a *Authorizer) park(ctx context.Context, inv *envelope.Invocation, m *tools.Manifest, d policy.Decision) ([]stages.Output, error) {
	parked, err := json.Marshal(inv)
	if err != nil {
		return nil, err
	}
	now := a.cfg.Now().UTC()
	stored, _, err := a.cfg.Store.RequestApproval(ctx, kvstore.Approval{
		InvocationID: inv.ID, Tenant: inv.Tenant, ToolID: m.ID, ToolVersion: m.Version,
		Reasons: d.Reasons, RequestedAt: now, Deadline: now.Add(a.cfg.ApprovalTimeout), Invocation: parked,
	})
	if err != nil {
		return nil, stages.Transient(err, 0)
	}
	inv.Status = api.StatusPendingApproval
	rec := api.Record{
		InvocationID: inv.ID, Tenant: inv.Tenant, Status: inv.Status,
		ToolID: m.ID, ToolVersion: m.Version, Seq: inv.Event.Seq,
	}
	if _, _, err := a.cfg.Store.SetStatus(ctx, rec); err != nil {
		return nil, stages.Transient(err, 0)
	}
	audit := inv.Audit()
	data := ApprovalRequested{
		AuditRecord: audit, Reasons: d.Reasons, RiskLevel: m.Safety.RiskLevel,
		SideEffects: m.Safety.SideEffects, Reversible: m.Safety.Reversible, Deadline: stored.Deadline,
	}
	ev, err := stages.AuditEvent(subjects.Authorize, inv, api.TypeApprovalRequested, data)
	if err != nil {
		return nil, err
	}
	return []stages.Output{ev}, nil
}

// reserveTree charges one call to the token's own budget (a child's) and to
// its tree's, the root's: a child's call is refused when either is spent.
// The own charge is undone when the tree refuses.
func (a *Authorizer) reserveTree(ctx context.Context, inv *envelope.Invocation, c *token.Claims, tree, own string, m *tools.Manifest, judged kvstore.Usage) error {
	if own == tree {
		if leasable(c.Budget) {
			return a.leases.reserve(ctx, inv, c.Budget, tree)
		}
		return a.reserve(ctx, inv, c.Budget, tree, m, &judged)
	}
	if err := a.reserve(ctx, inv, c.Budget, own, m, &judged); err != nil {
		return err
	}
	err := a.reserve(ctx, inv, c.TreeBudget(), tree, m, nil)
	if err == nil {
		return nil
	}
	_, uerr := a.cfg.Store.UpdateUsage(ctx, inv.Tenant, own, func(u *kvstore.Usage) error {
		if !u.Unreserve(inv.ID) {
			return errAlreadyReserved // nothing to undo
		}
		u.Calls--
		u.Release(inv.ID)
		return nil
	})
	if uerr != nil && !errors.Is(uerr, errAlreadyReserved) {
		return stages.Transient(uerr, 0) // retried: the own charge is found and kept
	}
	return err
}

func sessionAborted(ab kvstore.Abort) error {
	return api.NewError(api.PermissionDenied, api.ESessionAborted,
		"the session was ended by hook %s when invocation %s ended", ab.Hook, ab.InvocationID).
		WithDetail("aborted_by", ab.InvocationID)
}

// reserve charges one call to the usage under key with compare-and-swap, so
// concurrent calls on many workers never pass max_calls; runtime, cost and
// tokens are charged when calls end, so they can be overspent at most by the
// calls in flight. With judged, the usage the policy saw, the call is
// reserved only on that usage, its calls aside (max_calls is checked here
// on the stored count): if it moved, errUsageMoved.
func (a *Authorizer) reserve(ctx context.Context, inv *envelope.Invocation, b *token.Budget, key string, m *tools.Manifest, judged *kvstore.Usage) error {
	held, _ := ctx.Value(modelHoldKey{}).(*modelHold)
	var wait time.Duration
	var refused error // a refusal that still writes (stale leases dropped)
	_, err := a.cfg.Store.UpdateUsage(ctx, inv.Tenant, key, func(u *kvstore.Usage) error {
		refused = nil
		if ab := u.Aborted; ab != nil {
			return sessionAborted(*ab)
		}
		if u.HasReserved(inv.ID) {
			if h, ok := u.HoldOf(inv.ID); ok {
				held.set(h.Tokens, h.Cost) // a retry hands on what it held
			}
			return errAlreadyReserved
		}
		if judged != nil && moved(*judged, *u) {
			return errUsageMoved
		}
		now := a.cfg.Now()
		dropped := u.DropStaleLeases(now.Add(-leaseGrace))
		if b != nil {
			var perCall float64
			if m.Cost != nil {
				perCall = m.Cost.PerCall
			}
			switch {
			case b.MaxCalls > 0 && u.Calls >= b.MaxCalls && len(u.Leases) > 0:
				wait = leaseWait(u.Leases, now)
				return errLeasedElsewhere
			case b.MaxCalls > 0 && u.Calls >= b.MaxCalls:
				refused = exhausted("the token has made all %d of its calls", b.MaxCalls)
			case b.MaxRuntimeMS > 0 && u.RuntimeMS >= b.MaxRuntimeMS:
				refused = exhausted("the token has used its %d ms of runtime", b.MaxRuntimeMS)
			case b.MaxCost > 0 && u.Cost+perCall > b.MaxCost:
				refused = exhausted("the call would take the token's cost over %g", b.MaxCost)
			case b.MaxTokens > 0 && u.Tokens >= b.MaxTokens:
				refused = exhausted("the token has used its %d tokens", b.MaxTokens)
			}
			if refused == nil && m.Kind == "model" && (b.MaxTokens > 0 || b.MaxCost > 0) {
				// A model call holds all the budget leaves free before it
				// runs; audit releases what it did not use.
				heldTokens, heldCost := u.Held()
				tokens, cost := b.MaxTokens-u.Tokens-heldTokens, b.MaxCost-u.Cost-heldCost-perCall
				switch {
				case (b.MaxTokens > 0 && tokens <= 0) || (b.MaxCost > 0 && cost <= 0):
					if len(u.Holds) > 0 {
						return errHeldElsewhere // released when those calls end
					}
					refused = exhausted("the token has no tokens or cost left for a model call")
				default:
					if b.MaxTokens <= 0 {
						tokens = 0
					}
					if b.MaxCost <= 0 {
						cost = 0
					}
					u.Hold(inv.ID, tokens, cost)
					held.set(tokens, cost)
				}
			}
			if refused != nil {
				if dropped {
					return nil // the stale leases' drop is written, the call refused
				}
				return refused
			}
		}
		u.Calls++
		u.Reserve(inv.ID)
		return nil
	})
	var te *api.Error
	switch {
	case err == nil && refused != nil:
		return refused
	case err == nil, errors.Is(err, errAlreadyReserved):
		return nil
	case errors.As(err, &te), errors.Is(err, errUsageMoved):
		return err
	case errors.Is(err, errLeasedElsewhere):
		return stages.Transient(err, wait)
	case errors.Is(err, errHeldElsewhere):
		return stages.Transient(err, 200*time.Millisecond)
	}
	return stages.Transient(err, 0)
}

// errHeldElsewhere: the budget's tokens or cost are held by model calls in
// flight; the call is tried again once they may have ended.
var errHeldElsewhere = errors.New("the budget is held by model calls in flight")

// modelHold is what a model call may use: the least of what reserve held
// of each budget it charged (the token's own and its tree's).
type modelHold struct {
	tokens int64
	cost   float64
}

type modelHoldKey struct{}

func (h *modelHold) set(tokens int64, cost float64) {
	if h == nil {
		return
	}
	if tokens > 0 && (h.tokens == 0 || tokens < h.tokens) {
		h.tokens = tokens
	}
	if cost > 0 && (h.cost == 0 || cost < h.cost) {
		h.cost = cost
	}
}

// moved reports whether the usage a policy judged differs from the stored
// one in anything the policy sees but the count of calls.
func moved(judged, stored kvstore.Usage) bool {
	return judged.RuntimeMS != stored.RuntimeMS || judged.Cost != stored.Cost || judged.Tokens != stored.Tokens ||
		judged.ConsecutiveFailures != stored.ConsecutiveFailures || (judged.Aborted == nil) != (stored.Aborted == nil) ||
		!judged.StartedAt.Equal(stored.StartedAt)
}

var errAlreadyReserved = errors.New("already reserved")

func exhausted(format string, args ...any) error {
	return api.NewError(api.ResourceExhausted, api.EBudgetExhausted, "budget exhausted: "+format, args...)
}

func redactToken(req *api.Request) *api.Request {
	r := *req
	r.CapabilityToken = "" // a policy never needs the raw token
	return &r
}

// resources lists what a call of m with params needs.
func resources(m *tools.Manifest, params json.RawMessage) Resources {
	r := Resources{Paths: []PathNeed{}, Hosts: []HostNeed{}, Credentials: []string{}}
	writes := slices.ContainsFunc(m.Safety.SideEffects, func(s string) bool { return strings.HasPrefix(s, "fs.write") })
	paramMode := "ro"
	if writes {
		paramMode = "rw"
	}
	// The paths a call names are what it needs; the manifest's filesystem
	// permissions (its widest reach) count only for tools that name none.
	if named := m.PathParameters(params); len(named) > 0 {
		for _, p := range named {
			// Validate refused climbing paths; what is left names a
			// place under the file root.
			if c, err := token.CleanPath(p); err == nil {
				r.Paths = append(r.Paths, PathNeed{Path: c, Mode: paramMode})
			}
		}
	} else {
		for _, p := range m.Permissions.Filesystem {
			if c, err := token.CleanPath(p.Path); err == nil {
				r.Paths = append(r.Paths, PathNeed{Path: c, Mode: cmp.Or(p.Mode, "ro")})
			}
		}
	}
	for _, n := range m.Permissions.Network {
		r.Hosts = append(r.Hosts, HostNeed{Host: strings.ToLower(n.Host), Port: n.Port})
	}
	// An http tool's URL may come from its parameters (http.get): the host
	// it names is a need too, so the policy refuses it before execute.
	if host, port, ok := httptool.Target(m, params); ok && !slices.Contains(r.Hosts, HostNeed{Host: host, Port: port}) {
		r.Hosts = append(r.Hosts, HostNeed{Host: host, Port: port})
	}
	r.Credentials = append(r.Credentials, m.Permissions.Credentials...)
	return r
}

func derive(c *token.Claims, m *tools.Manifest, r Resources) Derived {
	d := Derived{PreApproved: c.PreApproved.Match(m.ID), HostGranted: map[string]bool{}}
	for _, h := range r.Hosts {
		if c.Network != nil && hosts.Any(c.Network.AllowedHosts, h.Host) {
			d.HostGranted[h.Host] = true
		}
	}
	return d
}

// cleanGrants returns c with its granted paths in token.CleanPath's form, the
// form resources gives the paths a call needs, so the policy compares like
// with like whichever spelling the token uses. Verify refused paths that do
// not clean.
func cleanGrants(c *token.Claims) *token.Claims {
	if c.Filesystem == nil {
		return c
	}
	out, fs := *c, *c.Filesystem
	fs.AllowedPaths = make([]string, 0, len(c.Filesystem.AllowedPaths))
	for _, p := range c.Filesystem.AllowedPaths {
		if cp, err := token.CleanPath(p); err == nil {
			fs.AllowedPaths = append(fs.AllowedPaths, cp)
		}
	}
	out.Filesystem = &fs
	return &out
}

func grants(c *token.Claims) envelope.Grants {
	var g envelope.Grants
	if f := cleanGrants(c).Filesystem; f != nil {
		g.Paths, g.PathMode = f.AllowedPaths, cmp.Or(f.Mode, "ro")
	}
	if n := c.Network; n != nil {
		g.Hosts, g.Ports = n.AllowedHosts, n.AllowedPorts
	}
	if cr := c.Credentials; cr != nil {
		g.Secrets = cr.AllowedSecrets
	}
	return g
}

// plain turns v into the map/slice/number form OPA reads fastest and that
// follows the JSON field names.
func plain(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	return out, json.Unmarshal(b, &out)
}
