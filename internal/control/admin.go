package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"sort"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/redact"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// deleteTool removes one version of a tool: it no longer serves, and its
// manifest stays readable with who removed it and when. The reply comes
// once this process's registry sees it removed.
func (h *handlers) deleteTool(req micro.Request) {
	r, who, ok := h.toolVersionRequest(req)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := h.store.RemoveTool(ctx, r.ToolID, r.Version, kvstore.ToolRemoval{By: who, At: time.Now().UTC(), Proof: h.proof(req)})
	if err != nil {
		respondError(req, err)
		return
	}
	for ctx.Err() == nil {
		if seen, err := h.reg.Resolve(r.ToolID, r.Version); err != nil || seen.Lifecycle.State == tools.StateRemoved {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	h.audited(ctx, req, api.TypeToolDeleted, api.AdminChange{Action: "tools.delete", By: m.Lifecycle.RemovedBy, Target: r.ToolID + "@" + r.Version,
		Details: map[string]any{"removed_at": m.Lifecycle.RemovedAt}}, m)
}

// purgeTool deletes one version of a tool for good, removed or not.
func (h *handlers) purgeTool(req micro.Request) {
	r, who, ok := h.toolVersionRequest(req)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.store.PurgeTool(ctx, r.ToolID, r.Version); err != nil {
		respondError(req, err)
		return
	}
	for h.reg.Has(r.ToolID, r.Version) && ctx.Err() == nil {
		time.Sleep(2 * time.Millisecond)
	}
	h.audited(ctx, req, api.TypeToolPurged, api.AdminChange{Action: "tools.purge", By: who, Target: r.ToolID + "@" + r.Version}, r)
}

// toolVersionRequest takes an operator's signed {"tool_id","version"} of a
// registered version; on failure it has answered and ok is false.
func (h *handlers) toolVersionRequest(req micro.Request) (r api.ToolRequest, who string, ok bool) {
	if who, ok = h.operator(req, ""); !ok {
		return r, "", false
	}
	if err := decode(req.Data(), &r); err != nil || r.ToolID == "" || r.Version == "" {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, `expected {"tool_id":…, "version":…}`))
		return r, "", false
	}
	if !h.reg.Has(r.ToolID, r.Version) {
		respondError(req, api.NewError(api.ToolNotFound, api.EToolNotFound, "no tool %s version %s", r.ToolID, r.Version))
		return r, "", false
	}
	return r, who, true
}

// listApprovals answers a tenant's pending approvals, oldest first. On
// the tenant's own endpoint the body may be empty.
func (h *handlers) listApprovals() request[api.ApprovalsRequest] {
	return request[api.ApprovalsRequest]{
		expected: `{"tenant_id":…}`, scopedExpected: `{} or {"tenant_id":…}`, emptyScoped: true,
		tenant:   func(r *api.ApprovalsRequest) *string { return &r.Tenant },
		complete: func(*api.ApprovalsRequest) bool { return true },
		do:       h.doListApprovals,
	}
}

func (h *handlers) doListApprovals(r api.ApprovalsRequest, v viewer) (any, error) {
	if err := subjects.CheckTenant(r.Tenant); err != nil {
		return nil, api.WrapError(err, api.InvalidParameters, api.EInvalidName, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	all, err := h.store.PendingApprovals(ctx)
	if err != nil {
		return nil, err
	}
	out := api.ApprovalsResponse{Approvals: []api.ApprovalSummary{}}
	for _, a := range all {
		if a.Tenant != r.Tenant {
			continue
		}
		// An agent lists only its own calls' approvals.
		if s := summarize(a); v.sees(s.AgentDID) {
			out.Approvals = append(out.Approvals, s)
		}
	}
	sort.Slice(out.Approvals, func(i, j int) bool { return out.Approvals[i].RequestedAt.Before(out.Approvals[j].RequestedAt) })
	return out, nil
}

// getApproval answers one approval of a tenant, in any state.
func (h *handlers) getApproval() request[api.ApprovalsRequest] {
	return request[api.ApprovalsRequest]{
		expected: `{"tenant_id":…, "invocation_id":…}`, scopedExpected: `{"invocation_id":…}`,
		tenant:   func(r *api.ApprovalsRequest) *string { return &r.Tenant },
		complete: func(r *api.ApprovalsRequest) bool { return r.InvocationID != "" },
		do:       h.doGetApproval,
	}
}

func (h *handlers) doGetApproval(r api.ApprovalsRequest, v viewer) (any, error) {
	if err := checkNames(r.Tenant, r.InvocationID); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a, err := h.store.Approval(ctx, r.Tenant, r.InvocationID)
	if errors.Is(err, kvstore.ErrNotFound) {
		err = api.NewError(api.InvocationNotFound, api.EInvocationNotFound, "no approval for invocation %q", r.InvocationID)
	}
	if err != nil {
		return nil, err
	}
	s := summarize(a)
	if !v.sees(s.AgentDID) {
		return nil, h.notOwn(v, "approvals.get", r.Tenant, r.InvocationID, "")
	}
	return s, nil
}

// summarize shows an approval without its parked envelope, the call's
// parameters redacted.
func summarize(a kvstore.Approval) api.ApprovalSummary {
	s := api.ApprovalSummary{InvocationID: a.InvocationID, Tenant: a.Tenant, ToolID: a.ToolID, ToolVersion: a.ToolVersion,
		Reasons: a.Reasons, State: a.State, RequestedAt: a.RequestedAt, Deadline: a.Deadline,
		DecidedAt: a.DecidedAt, DecidedBy: a.DecidedBy, Reason: a.Reason, Required: a.Required}
	for _, v := range a.Approvals {
		s.Approvers = append(s.Approvers, v.DecidedBy)
	}
	var inv envelope.Invocation
	if len(a.Invocation) > 0 && json.Unmarshal(a.Invocation, &inv) == nil && inv.Request != nil {
		s.AgentDID = inv.Request.AgentContext.AgentDID
		s.Parameters = redact.Redact(inv.Request.Parameters)
		s.RequestDigest = envelope.RequestDigest(inv.Request)
	}
	return s
}

// holds reports whether the registry has m's id and version with m's
// content, so a replaced manifest counts only once the new one is in.
func (h *handlers) holds(m *tools.Manifest) bool {
	want, err := json.Marshal(m)
	if err != nil {
		return h.reg.Has(m.ID, m.Version)
	}
	for _, cur := range h.reg.Versions(m.ID) {
		if cur.Version == m.Version {
			got, err := json.Marshal(cur)
			return err == nil && bytes.Equal(got, want)
		}
	}
	return false
}
