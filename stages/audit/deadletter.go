package audit

import (
	"encoding/json"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// deadLetter keeps inv, ended on a failure whose cause may pass
// (api.Redrivable), for a re-drive (docs/redrive.md); ok is false for
// every other ending. The request keeps no capability token, raw or
// sealed: a re-drive needs the caller's token again, or an operator's
// decision, which runs as the principal authorize verified and signed.
func deadLetter(inv *envelope.Invocation, now time.Time) (o stages.Output, ok bool, err error) {
	if inv.Request == nil || inv.Status == api.StatusSuccess || !api.Redrivable(inv.Error) {
		return stages.Output{}, false, nil
	}
	req := *inv.Request
	req.CapabilityToken = ""
	req.InvocationID = inv.ID
	d := api.DeadLetter{
		InvocationID: inv.ID, Tenant: inv.Tenant, ToolID: inv.ToolID(), ToolVersion: inv.ToolVersion(),
		Status: inv.Status, Error: inv.Error, EndedBy: inv.EndedBy, EndedAt: now.UTC(), Request: req,
	}
	if p := inv.Principal; p != nil {
		d.Principal = &api.DeadLetterPrincipal{Session: p.Session, Claims: p.Claims, Sig: p.Sig}
		if inv.Authz != nil && inv.Authz.Seal != nil && inv.Authz.Seal.Principal != "" {
			// The seal vouches for the principal of a call authorize admitted.
			if d.Principal.Seal, err = json.Marshal(inv.Authz.Seal); err != nil {
				return stages.Output{}, false, err
			}
		}
	}
	data, err := json.Marshal(d)
	if err != nil {
		return stages.Output{}, false, err
	}
	return stages.Output{Subject: subjects.DeadLetter(inv.Tenant, inv.ID), MsgID: inv.MsgID("deadletter"),
		Header: map[string][]string{"Content-Type": {"application/json"}}, Data: data}, true, nil
}
