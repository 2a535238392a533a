package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/hooks"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// hookStore is what the hook step reads and writes (*kvstore.Store).
type hookStore interface {
	Usage(ctx context.Context, tenant, session string) (kvstore.Usage, error)
	RecordHookDecision(ctx context.Context, d kvstore.HookDecision) (kvstore.HookDecision, error)
	HookDecisionOf(ctx context.Context, tenant, id string) (kvstore.HookDecision, error)
	AbortSession(ctx context.Context, tenant, key, id, hook string) error
}

var _ hookStore = (*kvstore.Store)(nil)

// Hooks configures the hook step of audit: where the manifests and the
// tenants' hook sets are.
type Hooks struct {
	Registry *tools.Registry
	Tenants  *hooks.Tenants
	Store    hookStore
	// PrincipalSigned, when set, checks authorize's signature over an
	// invocation's principal (envelope.PrincipalText), and PrincipalSealed
	// the authorization seal that covers the principal of a call authorize
	// admitted (seal.Verifier.Principal): a child is started as the claims
	// authorize verified, never as claims another stage put in the
	// envelope. SignDecision signs each decision audit records
	// (kvstore.DecisionText), and DecisionSigned checks one read back: a
	// decision another role wrote into the bucket is never repeated, and
	// authorize admits no child by it. All are set together, on a bus
	// where every role signs (seal.Messages, seal.Signer).
	PrincipalSigned func(text []byte, sig string) bool
	PrincipalSealed func(inv *envelope.Invocation, sl *envelope.Seal) bool
	SignDecision    func(text []byte) string
	DecisionSigned  func(text []byte, sig string) bool
}

// principalVouched reports whether authorize sealed inv with its
// principal, or signed the principal of a call it did not seal.
func (h *Hooks) principalVouched(inv *envelope.Invocation) bool {
	if inv.Authz != nil && inv.Authz.Seal != nil && h.PrincipalSealed != nil && h.PrincipalSealed(inv, inv.Authz.Seal) {
		return true
	}
	return h.PrincipalSigned(envelope.PrincipalText(inv), inv.Principal.Sig)
}

// signed reports whether d is a decision audit made (always, where
// decisions are not signed).
func (h *Hooks) signed(d kvstore.HookDecision) bool {
	if h.DecisionSigned == nil {
		return true
	}
	text, err := kvstore.DecisionText(d)
	return err == nil && h.DecisionSigned(text, d.Sig)
}

// errForgedDecision: the bucket holds a hook decision on the invocation
// that audit did not sign. It stands there (the first decision wins), so
// no hook runs on this invocation; the invocation itself still ends.
var errForgedDecision = errors.New("the stored hook decision is not signed by the audit stage")

// decide runs the hooks on an ended invocation and returns the decision,
// or nil when no hook applies. The first decision on an invocation is
// stored before anything is published and reused on a redelivery, so the
// invocation ends once, the same way, and what authorize later admits as
// its child is exactly what was decided.
func (h *Hooks) decide(ctx context.Context, inv *envelope.Invocation) (*kvstore.HookDecision, error) {
	if h == nil || inv.Request == nil {
		return nil, nil
	}
	trigger, ok := hooks.Classify(inv.Status, inv.Error)
	if !ok {
		return nil, nil
	}
	var m *tools.Manifest
	if h.Registry != nil {
		m, _ = h.Registry.Resolve(inv.ToolID(), inv.ToolVersion())
	}
	var own *hooks.Set
	if m != nil {
		own = m.HookSet()
	}
	tenant := h.Tenants.Get(inv.Tenant)
	// A redelivery looks for the first delivery's decision even when the
	// hooks have since been removed: part of its outcome may be out.
	if delivered, _ := stages.Delivery(ctx); own == nil && tenant == nil && delivered <= 1 {
		return nil, nil
	}
	stored, err := h.Store.HookDecisionOf(ctx, inv.Tenant, inv.ID)
	switch {
	case err == nil && stored.Seq == inv.Event.Seq:
		if !h.signed(stored) {
			return nil, errForgedDecision
		}
		return &stored, nil
	case err != nil && !errors.Is(err, kvstore.ErrNoHookDecision):
		return nil, stages.Transient(fmt.Errorf("reading the hook decision: %w", err), 0)
	}
	if own == nil && tenant == nil {
		return nil, nil
	}
	var usage kvstore.Usage
	if p := inv.Principal; p != nil {
		if usage, err = h.Store.Usage(ctx, inv.Tenant, p.Session); err != nil {
			return nil, stages.Transient(fmt.Errorf("reading the session's usage: %w", err), 0)
		}
	}
	o := outcome(inv, trigger, usage, m)
	link := inv.Request.Link
	match, errs := hooks.Decide(ctx, o, inv.ToolID(), link, own, tenant)
	if match == nil && len(errs) == 0 {
		return nil, nil
	}
	d := kvstore.HookDecision{InvocationID: inv.ID, Tenant: inv.Tenant, Seq: inv.Event.Seq, Trigger: trigger, ConditionErrors: errs}
	if match != nil {
		d.Hook, d.Source, d.Action = match.Spec.Name, match.Source, match.Spec.Action
		switch {
		case match.Spec.Starts():
			depth, root := 1, inv.ID
			if link != nil {
				depth, root = link.Depth+1, link.Root
			}
			if depth > hooks.MaxDepth {
				d.Limit = true
				break
			}
			child, err := childOf(inv, match, o, &api.Link{Parent: inv.ID, Root: root, Hook: match.Spec.Name,
				Action: match.Spec.Action, Depth: depth, Attempt: match.Attempt})
			if err == nil && h.PrincipalSigned != nil && inv.Principal != nil && !h.principalVouched(inv) {
				err = errors.New("the invocation's principal is not signed by authorize")
			}
			if err != nil {
				d.ConditionErrors = append(d.ConditionErrors, fmt.Sprintf("%s hook %s: %v", match.Source, match.Spec.Name, err))
				d.Hook, d.Source, d.Action = "", "", ""
				break
			}
			d.Child = child
		case match.Spec.Action == hooks.ActionAbort && inv.Principal != nil:
			d.Session = inv.Principal.Session
		}
	}
	if h.SignDecision != nil {
		d.DecidedAt = time.Now().UTC()
		text, err := kvstore.DecisionText(d)
		if err != nil {
			return nil, err
		}
		d.Sig = h.SignDecision(text)
	}
	got, err := h.Store.RecordHookDecision(ctx, d)
	if err != nil {
		return nil, stages.Transient(err, 0)
	}
	if !h.signed(got) {
		return nil, errForgedDecision
	}
	return &got, nil
}

// childOf builds the request of the invocation a retry or fallback starts.
func childOf(inv *envelope.Invocation, match *hooks.Match, o hooks.Outcome, link *api.Link) (*kvstore.HookChild, error) {
	orig := inv.Request
	req := api.Request{
		ToolID: orig.ToolID, ToolVersion: orig.ToolVersion, AgentContext: orig.AgentContext,
		Parameters: orig.Parameters, ResourceLimits: orig.ResourceLimits, Link: link,
	}
	if fb := match.Spec.Fallback; fb != nil {
		req.ToolID, req.ToolVersion, req.ResourceLimits = fb.ToolID, fb.ToolVersion, nil
		if len(fb.Parameters) > 0 {
			params, _, err := hooks.Render(fb.Parameters, o)
			if err != nil {
				return nil, err
			}
			req.Parameters = params
		}
	}
	if len(req.Parameters) == 0 {
		req.Parameters = json.RawMessage(`{}`)
	}
	// The child is a call of its own: no idempotency key (it would answer
	// with the parent's result), the same priority and mode.
	if eo := orig.ExecutionOptions; eo != nil {
		req.ExecutionOptions = &api.ExecutionOptions{AsyncMode: eo.AsyncMode, Priority: eo.Priority}
	}
	c := &kvstore.HookChild{ID: childID(link.Root, link.Depth), Request: req}
	if p := inv.Principal; p != nil {
		c.Claims = p.Claims
	}
	return c, nil
}

// childID derives the id of the invocation at depth of the chain rooted at
// root; it stays within the id limit however long root is.
func childID(root string, depth int) string {
	suffix := fmt.Sprintf(".hook%d", depth)
	if len(root)+len(suffix) > subjects.MaxIDBytes {
		sum := sha256.Sum256([]byte(root))
		root = hex.EncodeToString(sum[:16])
	}
	return root + suffix
}

// apply makes the invocation's outcome what the decision says.
func apply(inv *envelope.Invocation, d *kvstore.HookDecision) {
	ho := &api.HookOutcome{Hook: d.Hook, Source: d.Source, Trigger: d.Trigger, Action: d.Action, ConditionErrors: d.ConditionErrors}
	if inv.Request != nil && inv.Request.Link != nil {
		ho.Parent = inv.Request.Link.Parent
	}
	inv.Metadata.Hook = ho
	cause := inv.Error
	switch {
	case d.Limit:
		inv.Fail(inv.EndedBy, api.NewError(api.ResourceExhausted, api.EHookLimit,
			"hook %s would start an invocation past the chain's depth limit of %d", d.Hook, hooks.MaxDepth).
			WithDetail("cause", cause).WithDetail("max_depth", hooks.MaxDepth))
	case d.Child != nil:
		ho.HandedTo = d.Child.ID
	case inv.Status == api.StatusSuccess:
		// A success stays one: the tool ran. Only abort adds to it.
	case d.Action == hooks.ActionSkip:
		inv.Fail(inv.EndedBy, api.NewError(api.Cancelled, api.EHookSkipped, "skipped by hook %s: %s", d.Hook, cause.Message).
			WithDetail("cause", cause))
	case d.Action == hooks.ActionFail:
		inv.Error.Retryable = false
	}
	if d.Action == hooks.ActionAbort {
		ho.SessionAborted = d.Session != ""
	}
}

// childEvent is the tool.invoke event of the invocation a hook started,
// published by audit onto the tenant's invoke subject: it passes every
// stage like any call.
func childEvent(inv *envelope.Invocation, c *kvstore.HookChild) (stages.Output, error) {
	source := "urn:toolgate:" + subjects.Audit
	e, err := api.NewEvent(c.ID, source, api.TypeInvoke, c.Request)
	if err != nil {
		return stages.Output{}, err
	}
	e.Subject = c.Request.ToolID
	if tp := inv.Origin.TraceParent; tp != "" {
		e.Extensions = map[string]string{"traceparent": tp}
		if ts := inv.Origin.TraceState; ts != "" {
			e.Extensions["tracestate"] = ts
		}
	}
	h, body, err := e.Binary()
	if err != nil {
		return stages.Output{}, err
	}
	id := api.InvokeMsgID(inv.Tenant, source, c.ID)
	h[api.MsgIDHeader] = []string{id}
	return stages.Output{Subject: subjects.Invoke(inv.Tenant), MsgID: id, Header: h, Data: body}, nil
}

// outcome is what the hooks see of inv.
func outcome(inv *envelope.Invocation, trigger string, u kvstore.Usage, m *tools.Manifest) hooks.Outcome {
	req := inv.Request
	var params any
	_ = json.Unmarshal(req.Parameters, &params)
	in := map[string]any{
		"id": inv.ID, "tenant": inv.Tenant, "tool_id": inv.ToolID(), "tool_version": inv.ToolVersion(),
		"parameters": params, "agent_did": req.AgentContext.AgentDID, "session_id": req.AgentContext.SessionID,
		"stage": inv.EndedBy, "depth": int64(0), "attempt": int64(0), "parent": "", "root": inv.ID,
	}
	if l := req.Link; l != nil {
		in["depth"], in["attempt"], in["parent"], in["root"] = int64(l.Depth), int64(l.Attempt), l.Parent, l.Root
	}
	errv := map[string]any{"code": "", "e_code": "", "message": "", "retryable": false, "details": map[string]any{}}
	if e := inv.Error; e != nil {
		details := map[string]any{}
		if b, err := json.Marshal(e.Details); err == nil {
			_ = json.Unmarshal(b, &details)
		}
		errv = map[string]any{"code": string(e.Code), "e_code": e.ECode, "message": e.Message, "retryable": e.Retryable, "details": details}
	}
	var result any
	if len(inv.Result) > 0 {
		_ = json.Unmarshal(inv.Result, &result)
	}
	usage := map[string]any{
		"calls": u.Made(), "runtime_ms": u.RuntimeMS, "cost": u.Cost, "tokens": u.Tokens,
		"consecutive_failures": u.ConsecutiveFailures,
	}
	man := map[string]any{}
	if m != nil {
		man = map[string]any{
			"id": m.ID, "version": m.Version, "kind": m.Kind, "category": m.Category, "tags": strs(m.Tags),
			"risk_level": m.Safety.RiskLevel, "side_effects": strs(m.Safety.SideEffects), "idempotent": m.Safety.Idempotent,
		}
		if m.Cost != nil {
			man["cost_per_call"] = m.Cost.PerCall
		}
	}
	return hooks.Outcome{Invocation: in, Status: string(inv.Status), Trigger: trigger, Error: errv, Result: result, Usage: usage, Manifest: man}
}

func strs(s []string) []any {
	out := make([]any, len(s))
	for i, x := range s {
		out[i] = x
	}
	return out
}
