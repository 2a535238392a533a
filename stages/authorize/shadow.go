package authorize

import (
	"context"
	"errors"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// A shadow policy is a candidate authorize evaluates beside the live
// policy on every call, on the same input, enforcing only the live one
// (docs/authorization.md). Each call on which they disagree is audited as
// policy.shadow.diverged, with both decisions, and counted.

type shadowPolicy struct {
	engine   *policy.Engine
	revision uint64
}

// SetShadow makes e the candidate evaluated beside the live policy (nil:
// none); revision is its revision in the policies bucket.
func (a *Authorizer) SetShadow(e *policy.Engine, revision uint64) {
	if e == nil {
		a.shadow.Store(nil)
		return
	}
	a.shadow.Store(&shadowPolicy{engine: e, revision: revision})
}

// shadowed evaluates the candidate sh on input, the live policy's own
// input for the decision live, and records a disagreement. It never changes the
// call's outcome: a candidate that fails to evaluate is recorded as a
// denial with its error, and a failed announcement is retried with the
// call (the event's id is the call's, so a retry adds no second one).
func (a *Authorizer) shadowed(ctx context.Context, inv *envelope.Invocation, m *tools.Manifest, sh *shadowPolicy, input ast.Value, live policy.Decision) error {
	if sh == nil || input == nil {
		return nil
	}
	cand, err := sh.engine.Eval(ctx, input)
	if err != nil {
		cand = policy.Decision{Reasons: []string{"the candidate failed: " + err.Error()}, Code: api.EPolicyFailed}
	}
	if sameDecision(live, cand) {
		return nil
	}
	d := api.ShadowDivergence{
		InvocationID: inv.ID, TenantID: inv.Tenant, ToolID: m.ID, ToolVersion: m.Version,
		CandidateRevision: sh.revision, Live: shadowOf(live), Candidate: shadowOf(cand), Rule: ruleOf(live, cand),
	}
	if inv.Request != nil {
		d.AgentDID = inv.Request.AgentContext.AgentDID
	}
	if f := a.cfg.OnShadowDiverged; f != nil {
		f(d)
	}
	o, err := stages.AuditEvent(subjects.Authorize, inv, api.TypeShadowDiverged, d)
	if err != nil {
		return err
	}
	if err := stages.Announce(ctx, o); err != nil && !errors.Is(err, stages.ErrNoAnnouncer) {
		return stages.Transient(err, 0)
	}
	return nil
}

// sameDecision reports whether two decisions have the same effect.
func sameDecision(a, b policy.Decision) bool {
	return a.Allow == b.Allow && a.RequiresApproval == b.RequiresApproval && (a.Allow || a.Code == b.Code)
}

func shadowOf(d policy.Decision) api.ShadowDecision {
	return api.ShadowDecision{Allow: d.Allow, RequiresApproval: d.RequiresApproval, Code: d.Code, Reasons: d.Reasons}
}

// ruleOf names the rule a divergence is counted under: the first reason
// of whichever decision is the stricter one.
func ruleOf(live, cand policy.Decision) string {
	strict := cand
	if !live.Allow || (live.RequiresApproval && cand.Allow && !cand.RequiresApproval) {
		strict = live
	}
	if len(strict.Reasons) > 0 {
		return strict.Reasons[0]
	}
	if strict.Code != "" {
		return strict.Code
	}
	return "allow"
}
