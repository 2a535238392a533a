package policy

import (
	"context"

	"github.com/toolgate/toolgate/api"
)

// Replay evaluates e on each recorded decision input and returns every
// call it would decide otherwise than the live policy did
// (`toolgate policy replay`, docs/authorization.md). The inputs' parameters
// are redacted as audit redacts them, so a rule on a redacted value sees
// the redaction.
func Replay(ctx context.Context, e *Engine, recs []api.DecisionRecord) api.ReplayResult {
	res := api.ReplayResult{Changes: []api.ReplayChange{}}
	for _, r := range recs {
		if r.Input == nil {
			continue
		}
		res.Recorded++
		d, err := e.Eval(ctx, r.Input)
		if err != nil {
			d = Decision{Reasons: []string{"the candidate failed: " + err.Error()}, Code: api.EPolicyFailed}
		}
		live := r.Decision
		cand := api.ShadowDecision{Allow: d.Allow, RequiresApproval: d.RequiresApproval, Code: d.Code, Reasons: d.Reasons}
		if live.Allow == cand.Allow && live.RequiresApproval == cand.RequiresApproval && (live.Allow || live.Code == cand.Code) {
			continue
		}
		res.Changed++
		switch {
		case live.Allow && !cand.Allow:
			res.NewlyDenied++
		case !live.Allow && cand.Allow:
			res.NewlyAllowed++
		}
		res.Changes = append(res.Changes, api.ReplayChange{InvocationID: r.InvocationID, TenantID: r.TenantID,
			ToolID: r.ToolID, Time: r.RecordedAt, Live: live, Candidate: cand})
	}
	return res
}
