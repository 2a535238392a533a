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
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/stages/execute/kind"
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
	// Kinds say what a call of each tool kind needs (kinds.Compiled());
	// a call of a kind they do not hold is refused.
	Kinds    *kind.Registry
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
	// the envelope (envelope.PrincipalText) of a call it does not seal: a
	// refusal, a parked call, or every call without a Sealer. A sealed
	// call's principal is covered by the seal's one signature. Audit reads
	// either when a hook starts a child as the principal, and a re-drive on
	// an operator's decision runs as it. DecisionSigned checks audit's
	// signature over a hook decision (kvstore.DecisionText) before a linked
	// request is admitted as its child. Both are set on a bus where every
	// role signs (seal.Signer, seal.Messages).
	SignPrincipal  func(text []byte) string
	DecisionSigned func(text []byte, sig string) bool
	// Custody, when set, is control's custody of a call authorize parks
	// (seal.Signer.Custody, kept in the approval record): the proof, to
	// audit, that control ending the call (denied, cancelled while it
	// waits) held it. The custody of the stages after authorize is made
	// as each hop is handed on (runner.Runner.Custody).
	Custody func(tenant, id string, seq uint64) string
	// RedriveProof, when set, names the operator who signed a re-drive's
	// run request (signedstate.Verify) and PrincipalSigned checks
	// authorize's own signature over a dead-lettered call's principal, or
	// PrincipalSealed the seal that covers it (seal.Verifier.Principal);
	// all are set on an authenticated bus (docs/redrive.md).
	RedriveProof    func(p *api.DecisionProof) (string, error)
	PrincipalSigned func(text []byte, sig string) bool
	PrincipalSealed func(inv *envelope.Invocation, sl *envelope.Seal) bool
	// OnShadowDiverged, when set, is told of each call on which the
	// candidate policy (SetShadow) decided otherwise than the live one.
	OnShadowDiverged func(api.ShadowDivergence)
	// RecordDecisions audits each call's policy input, redacted, and the
	// live decision (policy.decision.recorded), for `policy replay`.
	RecordDecisions bool
	Now             func() time.Time
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
	shadow atomic.Pointer[shadowPolicy]
	// reads is what the policies in force read of the input (inputReads).
	reads atomic.Pointer[inputReads]
	tools manifestForms
	// claims and principals are the policy form and the JSON
	// (envelope.Principal) of a raw token's claims.
	claims     forms[ast.Value]
	principals forms[[]byte]
	leases     *leases
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

// Process implements stages.Stage.
func (a *Authorizer) Process(ctx context.Context, inv *envelope.Invocation) ([]stages.Output, error) {
	// A call handed on unsealed (refused, or with no Sealer) carries its
	// principal signed; a sealed one has it in the seal. Only the principal
	// set here, from claims verified here, is ever signed (ours).
	var sealed bool
	var ours *envelope.Principal
	defer func() {
		if !sealed && ours != nil && inv.Principal == ours {
			a.signPrincipal(inv)
		}
	}()
	req := inv.Request
	// Authorize takes every call first: what an earlier holder (control,
	// resuming a parked call) held is not handed on.
	inv.Custody = ""
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
	principal := func() ([]byte, error) { return json.Marshal(claims) }
	switch {
	case req.Link != nil:
		claims, err = a.linked(ctx, inv)
	case req.Redrive != nil:
		claims, err = a.redriven(ctx, inv, rawToken)
	default:
		claims, err = a.cfg.Verifier.Verify(rawToken)
		// The claims a token verifies to are the same on every call.
		marshal := principal
		principal = func() ([]byte, error) { return a.principals.value(rawToken, marshal) }
	}
	if err != nil {
		return nil, err
	}
	if id, revoked := a.cfg.Revoked.Revoked(claims); revoked {
		return nil, api.NewError(api.PermissionDenied, api.ETokenRevoked, "capability token %s is revoked", id)
	}
	if raw, err := principal(); err == nil {
		ours = &envelope.Principal{Session: token.BudgetKey(claims.Root()), Claims: raw}
		inv.Principal = ours
	} else {
		inv.Principal = nil // never one the hop arrived with, which park would sign
	}
	err = claims.Grants(token.Binding{
		Tenant: inv.Tenant, AgentDID: req.AgentContext.AgentDID, SessionID: req.AgentContext.SessionID,
		ToolID: m.ID, ToolVersion: m.Version,
	})
	if named := req.AgentContext.AgentDID; err != nil && claims.TenantID == inv.Tenant && claims.AgentDID != named {
		// Whoever holds the token made the call: the refusal, its
		// record and result are the token's agent's, never the agent the
		// request names, who made nothing.
		req.AgentContext.AgentDID = claims.AgentDID
		return nil, api.WrapError(err, api.PermissionDenied, api.ENotGranted, "%v", err).WithDetail("named_agent_did", named)
	}
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
	var revision uint64 // of the policy that admitted the call
	ctx = context.WithValue(ctx, revisionKey{}, &revision)
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
		TokenID: claims.ID, AgentDID: claims.AgentDID, Session: tree, Reserved: !req.DryRun(),
		Unmetered: !metered, Grants: grants(claims),
	}
	if own != tree {
		inv.Authz.TokenBudget = own
	}
	if m.Cost != nil {
		inv.Authz.CostPerCall = m.Cost.PerCall
	}
	inv.Authz.ModelTokens, inv.Authz.ModelCost = hold.tokens, hold.cost
	// What the call's receipt names its decision by.
	inv.Authz.PolicyRevision, inv.Authz.ManifestDigest = revision, m.Digest()
	if hasApproval && approval.State == kvstore.ApprovalApproved {
		inv.Authz.ApprovedBy = approval.DecidedBy
		inv.Authz.ApprovalProof = approval.Proof
		for _, v := range approval.Approvals {
			inv.Authz.Approvers = append(inv.Authz.Approvers, v.DecidedBy)
		}
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
		sealed = true
	}
	return nil, nil
}

// signPrincipal signs the principal of a call authorize hands on unsealed
// (Config.SignPrincipal).
func (a *Authorizer) signPrincipal(inv *envelope.Invocation) {
	p := inv.Principal
	if a.cfg.SignPrincipal == nil || p == nil || p.Sig != "" {
		return
	}
	p.Sig = a.cfg.SignPrincipal(envelope.PrincipalText(inv))
}

// revisionKey carries, in Process's context, where decide writes the
// revision of the policy that decided.
type revisionKey struct{}

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
	// charged: the call was charged before (a redelivery, or a re-drive
	// after the hops were lost), so it is judged on the usage as it was
	// without its own charge, and not charged again.
	var charged bool
	if metered {
		read := a.cfg.Store.RecentUsage
		if fresh {
			read = a.cfg.Store.Usage
		}
		if usage, err = read(ctx, inv.Tenant, own); err != nil {
			return approval, false, nil, true, stages.Transient(err, 0)
		}
		charged = usage.Charged(inv.ID)
		// The ids it remembers are bookkeeping for redeliveries, not usage;
		// leased calls not yet used are not made, but those this process
		// gave since its lease's write are.
		usage.Reserved, usage.Settled = nil, nil
		usage.Calls, usage.Leases = usage.Made()+a.leases.given(inv.Tenant, own), nil
		if charged && usage.Calls > 0 {
			usage.Calls--
		}
	}
	needs, err := resources(a.cfg.Kinds, m, req.Parameters)
	if err != nil {
		return approval, false, nil, true, err
	}
	in := Input{
		Request: redactToken(req), Tool: m, Claims: cleanGrants(claims), Usage: usage,
		Resources: needs, Tenant: inv.Tenant,
		Time: a.cfg.Now().UTC().Format(time.RFC3339),
	}
	in.Derived = derive(claims, m, in.Resources)
	d, input, sh, err := a.evalInput(ctx, in, rawToken)
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
		if hasApproval && approval.State == kvstore.ApprovalApproved {
			// The policy's judgement without the decision says how many
			// must approve (by risk level), as it did when it parked.
			if err := checkApprovers(approval, requiredApprovers(m, d), envelope.RequestDigest(inv.Request), a.cfg.ApprovalProof); err != nil {
				return approval, hasApproval, nil, true, err
			}
		}
		if hasApproval {
			in.Approval = &ApprovalInput{State: approval.State, DecidedBy: approval.DecidedBy}
			if d, input, sh, err = a.evalInput(ctx, in, rawToken); err != nil {
				return approval, hasApproval, nil, true, err
			}
		}
	}
	if err := a.shadowed(ctx, inv, m, sh, input, d); err != nil {
		return approval, hasApproval, nil, true, err
	}
	if err := a.record(ctx, inv, in, d); err != nil {
		return approval, hasApproval, nil, true, err
	}
	if p, ok := ctx.Value(revisionKey{}).(*uint64); ok {
		*p = d.Revision
	}
	if !d.Allow {
		return approval, hasApproval, nil, true, denial(d)
	}
	if req.DryRun() {
		// Judged like a real call, and recorded; then nothing is parked
		// and nothing reserved: the plan says what would have been.
		plan := &api.DryRunPlan{ApprovalRequired: d.RequiresApproval}
		if d.RequiresApproval {
			plan.Approvers, plan.ApprovalReasons = max(requiredApprovers(m, d), 1), d.Reasons
		}
		if metered {
			plan.BudgetCharge = &api.BudgetCharge{Calls: 1}
			if m.Cost != nil {
				plan.BudgetCharge.Cost = m.Cost.PerCall
			}
		}
		inv.Metadata.DryRun, inv.Metadata.DryRunPlan = true, plan
		return approval, hasApproval, nil, false, nil
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
		if err := a.reserveTree(ctx, inv, claims, tree, own, m, usage, charged); err != nil {
			return approval, hasApproval, nil, !errors.Is(err, errUsageMoved), err
		}
	}
	return approval, hasApproval, nil, false, nil
}
