// Package approval decides parked invocations: a human's approve or deny,
// or the deadline passing. Of any number of decisions on one invocation,
// sent to any number of processes, exactly one wins (a compare-and-swap on
// its approval record), and only the winner resumes or ends the invocation.
package approval

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// Decided is the audit data of a decision.
type Decided struct {
	envelope.AuditRecord
	Decision  string `json:"decision"`
	DecidedBy string `json:"decided_by"`
	Reason    string `json:"reason,omitempty"`
	// BreakGlass marks a decision signed with the operator credential
	// (operator:<name>) rather than a named approver's.
	BreakGlass bool `json:"break_glass,omitempty"`
	// Under the two-person rule: how many different people have approved
	// of how many required, and who (break-glass approvals among them).
	Approvals int      `json:"approvals,omitempty"`
	Required  int      `json:"approvals_required,omitempty"`
	Approvers []string `json:"approvers,omitempty"`
}

// Store holds approval records (*kvstore.Store). Decide moves a pending
// approval to state with a compare-and-swap: of concurrent decisions exactly
// one succeeds, the others get E3215 (api.EApprovalDecided) and an unknown
// invocation E3214.
type Store interface {
	Decide(ctx context.Context, tenant, id, state, by, reason string, proof *api.DecisionProof, check func(kvstore.Approval) error) (kvstore.Approval, error)
	PendingApprovals(ctx context.Context) ([]kvstore.Approval, error)
}

var _ Store = (*kvstore.Store)(nil)

// Service applies decisions.
type Service struct {
	Store Store
	JS    jetstream.JetStream
	Log   *slog.Logger
	// EndingTag, when set, is control's tag in the id of an ending it
	// hands audit (runner.EndingID, seal.Signer.EndingTag).
	EndingTag func(tenant, id string, seq uint64) string
}

// Decide records d and, if it is the first decision, resumes the invocation
// at authorize (approved) or ends it through audit (denied). A second
// decision gets E3215; an unknown invocation E3214.
func (s *Service) Decide(ctx context.Context, d api.ApprovalDecision) (kvstore.Approval, error) {
	if d.Tenant == "" || d.InvocationID == "" || d.DecidedBy == "" {
		return kvstore.Approval{}, api.NewError(api.InvalidParameters, api.ERequestInvalid,
			"a decision needs tenant_id, invocation_id and decided_by")
	}
	if err := subjects.CheckTenant(d.Tenant); err != nil {
		return kvstore.Approval{}, api.WrapError(err, api.InvalidParameters, api.EInvalidName, "%v", err)
	}
	state := kvstore.ApprovalDenied
	var check func(kvstore.Approval) error
	if d.Approve {
		state = kvstore.ApprovalApproved
		if d.RequestDigest == "" {
			return kvstore.Approval{}, api.NewError(api.InvalidParameters, api.EApprovalMismatch,
				"an approval must name the request it approves: request_digest, as approvals get shows it")
		}
		check = func(a kvstore.Approval) error {
			if got := ParkedDigest(a); got != d.RequestDigest {
				return api.NewError(api.StateConflict, api.EApprovalMismatch,
					"the parked request of %s is not the one approved (request_digest %s, parked %s): review it again",
					d.InvocationID, d.RequestDigest, got)
			}
			return nil
		}
	}
	a, err := s.Store.Decide(ctx, d.Tenant, d.InvocationID, state, d.DecidedBy, d.Reason, d.Proof, check)
	if err != nil {
		return a, err
	}
	return a, s.apply(ctx, a)
}

// apply carries a won decision into the pipeline. Its publishes carry ids
// derived from the invocation, so applying twice publishes once.
func (s *Service) apply(ctx context.Context, a kvstore.Approval) error {
	var inv envelope.Invocation
	if err := json.Unmarshal(a.Invocation, &inv); err != nil {
		return fmt.Errorf("parked invocation %s: %w", a.InvocationID, err)
	}
	var typ, next string
	switch a.State {
	case kvstore.ApprovalPending:
		if len(a.Approvals) == 0 {
			return fmt.Errorf("approval of %s is pending, nothing to apply", a.InvocationID)
		}
		// A partial approval under the two-person rule: audited, and the
		// call stays parked for the next person.
		typ = api.TypeApprovalGranted
	case kvstore.ApprovalApproved:
		typ, next = api.TypeApprovalGranted, subjects.Authorize
	case kvstore.ApprovalDenied:
		typ, next = api.TypeApprovalDenied, subjects.Audit
		inv.Fail(subjects.Authorize, api.NewError(api.PermissionDenied, api.EApprovalDenied,
			"%s denied the call: %s", a.DecidedBy, a.Reason))
	case kvstore.ApprovalExpired:
		typ, next = api.TypeApprovalExpired, subjects.Audit
		inv.Fail(subjects.Authorize, api.NewError(api.PermissionDenied, api.EApprovalExpired,
			"no one approved the call before %s", a.Deadline.Format(time.RFC3339)))
	case kvstore.ApprovalCancelled:
		typ, next = api.TypeApprovalDenied, subjects.Audit
		inv.Fail(subjects.Authorize, api.NewError(api.Cancelled, api.ECancelled,
			"cancelled by %s while waiting for approval", a.DecidedBy))
	default:
		return fmt.Errorf("approval of %s is %s, nothing to apply", a.InvocationID, a.State)
	}
	data := Decided{
		AuditRecord: inv.Audit(), Decision: a.State, DecidedBy: a.DecidedBy, Reason: a.Reason,
		BreakGlass: a.Proof != nil && strings.HasPrefix(a.DecidedBy, "operator:"),
	}
	if len(a.Approvals) > 0 {
		data.Approvals, data.Required = len(a.Approvals), a.Required
		for _, v := range a.Approvals {
			data.Approvers = append(data.Approvers, v.DecidedBy)
			data.BreakGlass = data.BreakGlass || (v.Proof != nil && strings.HasPrefix(v.DecidedBy, "operator:"))
		}
	}
	if a.State == kvstore.ApprovalPending {
		last := a.Approvals[len(a.Approvals)-1]
		data.Decision, data.DecidedBy, data.Reason = kvstore.ApprovalApproved, last.DecidedBy, last.Reason
	}
	ev, err := stages.AuditEvent(subjects.Authorize, &inv, typ, data)
	if err != nil {
		return err
	}
	if a.State == kvstore.ApprovalPending {
		// Each partial approval is an event of its own, not a duplicate
		// of the final one.
		ev.MsgID = inv.MsgID(fmt.Sprintf("audit.approval.partial.%d", len(a.Approvals)))
		if err := runner.Publish(ctx, s.JS, ev); err != nil {
			return fmt.Errorf("publishing decision on %s: %w", a.InvocationID, err)
		}
		return nil
	}
	hop, err := runner.Handoff(&inv, next)
	if err != nil {
		return err
	}
	hop.MsgID = inv.MsgID("decision")
	if next == subjects.Audit && s.EndingTag != nil {
		hop.MsgID = runner.EndingID(hop.MsgID, s.EndingTag(inv.Tenant, inv.ID, inv.Event.Seq))
	}
	for _, o := range []stages.Output{ev, hop} {
		if err := runner.Publish(ctx, s.JS, o); err != nil {
			return fmt.Errorf("publishing decision on %s: %w", a.InvocationID, err)
		}
	}
	return nil
}

// Cancel ends a parked invocation as cancelled. It is E3214 when nothing is
// parked under that id and E3215 when it was decided already.
func (s *Service) Cancel(ctx context.Context, tenant, id, by, reason string) error {
	a, err := s.Store.Decide(ctx, tenant, id, kvstore.ApprovalCancelled, by, reason, nil, nil)
	if err != nil {
		return err
	}
	return s.apply(ctx, a)
}

// Sweep ends every pending approval whose deadline has passed, as denied
// (expired). Several processes may sweep at once: the compare-and-swap lets
// one of them end each.
func (s *Service) Sweep(ctx context.Context, now time.Time) (int, error) {
	pending, err := s.Store.PendingApprovals(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range pending {
		if now.Before(p.Deadline) {
			continue
		}
		a, err := s.Store.Decide(ctx, p.Tenant, p.InvocationID, kvstore.ApprovalExpired, "toolgate", "deadline passed", nil, nil)
		if errors.Is(err, &api.Error{Code: api.StateConflict, ECode: api.EApprovalDecided}) {
			continue // decided meanwhile
		}
		if err != nil {
			return n, err
		}
		if err := s.apply(ctx, a); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// RunSweeper sweeps every interval until ctx is done.
func (s *Service) RunSweeper(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := s.Sweep(ctx, time.Now()); err != nil && ctx.Err() == nil {
				s.Log.Warn("sweeping approvals", "err", err)
			}
		}
	}
}

// ParkedDigest is the request digest of a's parked call
// (envelope.RequestDigest), "" when it holds none.
func ParkedDigest(a kvstore.Approval) string {
	var inv envelope.Invocation
	if len(a.Invocation) == 0 || json.Unmarshal(a.Invocation, &inv) != nil {
		return ""
	}
	return envelope.RequestDigest(inv.Request)
}
