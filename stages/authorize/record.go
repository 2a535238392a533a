package authorize

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/redact"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// record audits the input the live policy judged the call on and its
// decision (Config.RecordDecisions), the request's parameters redacted as
// audit redacts them: `toolgate policy replay` evaluates a candidate
// against these records before it is pushed.
func (a *Authorizer) record(ctx context.Context, inv *envelope.Invocation, in Input, d policy.Decision) error {
	if !a.cfg.RecordDecisions {
		return nil
	}
	if in.Request != nil {
		r := *in.Request
		r.Parameters = redact.Redact(r.Parameters)
		in.Request = &r
	}
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	rec := api.DecisionRecord{InvocationID: inv.ID, TenantID: inv.Tenant, Decision: shadowOf(d)}
	if in.Tool != nil {
		rec.ToolID = in.Tool.ID
	}
	if err := json.Unmarshal(b, &rec.Input); err != nil {
		return err
	}
	o, err := stages.AuditEvent(subjects.Authorize, inv, api.TypeDecisionRecorded, rec)
	if err != nil {
		return err
	}
	if err := stages.Announce(ctx, o); err != nil && !errors.Is(err, stages.ErrNoAnnouncer) {
		return stages.Transient(err, 0)
	}
	return nil
}
