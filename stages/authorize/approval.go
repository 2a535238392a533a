package authorize

import (
	"context"
	"encoding/json"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

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

// park records a pending approval and leaves the invocation outside the
// pipeline until a decision resumes or ends it. Redelivery finds the stored
// approval and parks again with the same message ids.
func (a *Authorizer) park(ctx context.Context, inv *envelope.Invocation, m *tools.Manifest, d policy.Decision) ([]stages.Output, error) {
	if a.cfg.Custody != nil {
		inv.Custody = a.cfg.Custody(inv.Tenant, inv.ID, inv.Event.Seq)
	}
	// The parked call is not sealed: control may end it as it is.
	a.signPrincipal(inv)
	parked, err := json.Marshal(inv)
	if err != nil {
		return nil, err
	}
	now := a.cfg.Now().UTC()
	stored, _, err := a.cfg.Store.RequestApproval(ctx, kvstore.Approval{
		InvocationID: inv.ID, Tenant: inv.Tenant, ToolID: m.ID, ToolVersion: m.Version,
		Reasons: d.Reasons, RequestedAt: now, Deadline: now.Add(a.cfg.ApprovalTimeout), Invocation: parked,
		Required: requiredApprovers(m, d),
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

// requiredApprovers is how many different people must approve a call of
// m: the most its safety.approvers and the policy's decision d (by risk
// level) ask for; 0 when one suffices.
func requiredApprovers(m *tools.Manifest, d policy.Decision) int {
	if n := max(m.Safety.Approvers, d.Approvers); n > 1 {
		return n
	}
	return 0
}

// checkApprovers verifies an approved record under the two-person rule:
// as many approvals by different people as need, each (when verify
// is set) carrying that person's own signed decision. The record's own
// count is not trusted: the bucket is writable by every stage worker.
func checkApprovers(ap kvstore.Approval, need int, request string, verify func(kvstore.Approval, string) error) error {
	if need == 0 {
		return nil
	}
	seen := map[string]bool{}
	for _, v := range ap.Approvals {
		if seen[v.DecidedBy] {
			return api.NewError(api.PermissionDenied, api.EApprovalsShort,
				"the approval of %s names %s twice: it needs %d different people", ap.InvocationID, v.DecidedBy, need)
		}
		if verify != nil {
			one := ap
			one.DecidedBy, one.DecidedAt, one.Proof, one.Approvals = v.DecidedBy, v.DecidedAt, v.Proof, nil
			if err := verify(one, request); err != nil {
				return api.WrapError(err, api.PermissionDenied, api.EApprovalsShort,
					"the approval of %s by %s is not that person's signed decision: %v", ap.InvocationID, v.DecidedBy, err)
			}
		}
		seen[v.DecidedBy] = true
	}
	if len(seen) < need || !seen[ap.DecidedBy] {
		return api.NewError(api.PermissionDenied, api.EApprovalsShort,
			"%s has the approvals of %d different people, its tool needs %d", ap.InvocationID, len(seen), need)
	}
	return nil
}
