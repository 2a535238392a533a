package seal

import (
	"crypto/hmac"
	"encoding/base64"
	"slices"
	"strconv"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/subjects"
)

// custodyVersion prefixes the text of a custody MAC, apart from every
// hand-off's (hopVersion) under the same pair key.
const custodyVersion = "toolgate-custody-v1"

// Every role but audit may hand audit an ending, and a stage that ends a
// call must have held it. Validate and authorize take every call before
// any other stage, and end what they refuse. A stage after them gets only
// what authorize handed on; so, as authorize takes a call, it puts in the
// envelope its custody: an HMAC over tenant, invocation id and ingest
// sequence under the key authorize and audit share (the pair key of
// mac.go), which no other role can make. Audit takes an ending from route,
// execute or verify, or control's ending of a parked call, only with the
// custody of that very call. It costs a hash at authorize and one at audit
// per call, in one process or many. An ending this process signed is
// checked too: an honest execute of this process ends, with E3218, a hop a
// compromised route host forged, and that ending must not take the id.

// Custody returns authorize's custody of the call (tenant, id, seq), or ""
// when s is not authorize's with the pair keys (NewSigner of Messages).
func (s *Signer) Custody(tenant, id string, seq uint64) string {
	if s == nil || s.role != busauth.RoleAuthorize || s.pairs == nil {
		return ""
	}
	k, ok := s.pairs.key(busauth.RoleAuthorize, busauth.RoleAudit, busauth.RoleAuthorize)
	if !ok {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString(mac(k, custodyText(tenant, id, seq)))
}

func custodyText(tenant, id string, seq uint64) []byte {
	b := make([]byte, 0, len(custodyVersion)+len(tenant)+len(id)+32)
	b = append(b, custodyVersion...)
	b = strconv.AppendQuote(append(b, '\n'), tenant)
	b = strconv.AppendQuote(append(b, '\n'), id)
	return strconv.AppendUint(append(b, '\n'), seq, 10)
}

// controlEndings are the endings control hands audit, of a call authorize
// parked for approval: denied, expired, cancelled while waiting.
var controlEndings = []string{api.EApprovalDenied, api.EApprovalExpired, api.ECancelled}

// Ending returns nil when sender, whose signature on the hand-off Check
// verified, may hand audit inv's ending, else a permission_denied
// *api.Error (E3230) saying why: the ending must name sender's own stage
// (control's, authorize's approval endings), be one that stage makes (a
// success only from execute or verify), and from a stage after authorize,
// or control, carry authorize's custody of this call.
func (m *Messages) Ending(sender busauth.Role, inv *envelope.Invocation) error {
	stage := string(sender)
	switch sender {
	case busauth.RoleValidate, busauth.RoleAuthorize, busauth.RoleRoute:
		if inv.Status == api.StatusSuccess {
			return refuseEnding(sender, inv, stage+" ends no call with a success")
		}
	case busauth.RoleExecute, busauth.RoleVerify:
	case busauth.RoleControl:
		// A decision on a parked call ends it as authorize's.
		stage = subjects.Authorize
		if inv.Error == nil || !slices.Contains(controlEndings, inv.Error.ECode) {
			return refuseEnding(sender, inv, "control ends a call only on an approval's denial, expiry or cancel")
		}
	default:
		return refuseEnding(sender, inv, "role "+string(sender)+" ends no call")
	}
	if inv.EndedBy != stage {
		return refuseEnding(sender, inv, "an ending by "+strconv.Quote(inv.EndedBy)+" is not "+string(sender)+"'s to hand on")
	}
	if sender == busauth.RoleValidate || sender == busauth.RoleAuthorize {
		return nil // they take every call first
	}
	if inv.Custody == "" {
		return refuseEnding(sender, inv, "it carries no custody of authorize: the call never reached "+string(sender)+" through authorize")
	}
	k, ok := m.pairs.key(busauth.RoleAuthorize, busauth.RoleAudit, busauth.RoleAudit)
	if !ok {
		return refuseEnding(sender, inv, "this process holds no key of audit to check authorize's custody")
	}
	raw, err := base64.RawURLEncoding.DecodeString(inv.Custody)
	if err != nil || !hmac.Equal(raw, mac(k, custodyText(inv.Tenant, inv.ID, inv.Event.Seq))) {
		return refuseEnding(sender, inv, "authorize's custody does not verify for this tenant, invocation and sequence: the call never reached "+string(sender))
	}
	return nil
}

func refuseEnding(sender busauth.Role, inv *envelope.Invocation, why string) error {
	code := ""
	if inv.Error != nil {
		code = " " + inv.Error.ECode
	}
	return api.NewError(api.PermissionDenied, api.EEndingRefused, "audit refused the ending of invocation %q (%s%s, ended by %q) from %s: %s",
		inv.ID, inv.Status, code, inv.EndedBy, sender, why).WithDetail("invocation_id", inv.ID).WithDetail("sender", string(sender))
}
