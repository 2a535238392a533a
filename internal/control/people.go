package control

import (
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
)

// signedBy names who signed req and checks that the signer's role may send
// it (busauth.MaySign): an approver decides approvals, an admin makes
// administrative changes, the operator either as break-glass. A signature
// that does not verify is refused with unverified (E3217 for decisions,
// E3219 for administration), a role that may not send the request with
// E3245; either refusal is audited (ai.agent.admin.refused). On a bus
// without authentication the body's by is taken, as before.
func (h *handlers) signedBy(req micro.Request, by, unverified, what string) (who string, ok bool) {
	if h.identify == nil {
		if by == "" {
			by = "unauthenticated"
		}
		return by, true
	}
	who, err := h.identify(req.Subject(), nats.Header(req.Headers()), req.Data())
	if err != nil {
		h.refuse(req, who, api.WrapError(err, api.PermissionDenied, unverified,
			"%s must be signed with credentials of this deployment: %v", what, err))
		return "", false
	}
	id, err := busauth.ParseUserName(who)
	if err == nil && !busauth.MaySign(id.Role, req.Subject()) {
		err = fmt.Errorf("%s credentials may not send %s", id.Role, req.Subject())
	}
	if err != nil {
		h.refuse(req, who, api.WrapError(err, api.PermissionDenied, api.ERoleNotPermitted,
			"%s: %v", what, err))
		return "", false
	}
	return who, true
}

// refuse answers a refused signed request and audits the refusal.
func (h *handlers) refuse(req micro.Request, who string, err *api.Error) {
	ctx, cancel := adminContext()
	defer cancel()
	c := api.AdminChange{Action: req.Subject(), By: who, Reason: err.Message, Details: map[string]any{"code": err.ECode}}
	if aerr := h.auditAdmin(ctx, api.TypeAdminRefused, c); aerr != nil {
		slog.Error("auditing a refused signed request", "subject", req.Subject(), "err", aerr)
	}
	respondError(req, err)
}

// breakGlass reports whether who is the operator credential: a change it
// signs is flagged in the trail.
func breakGlass(who string) bool {
	id, err := busauth.ParseUserName(who)
	return err == nil && busauth.BreakGlass(id.Role)
}
