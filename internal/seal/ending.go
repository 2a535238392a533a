package seal

import (
	"encoding/base64"
	"slices"
	"strconv"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/subjects"
)

// custodyVersion prefixes the text of a custody MAC, apart from every
// hand-off's (hopVersion) under the same pair key. Version 2 names the
// stage that holds the call.
const custodyVersion = "toolgate-custody-v2"

// Every role but audit may hand audit an ending, and a stage that ends a
// call must have held it. Validate and authorize take every call before
// any other stage, and end what they refuse. A stage after them holds
// only what the stage before it handed it; so each stage that hands a
// call on puts in the envelope the custody of the stage it hands it to:
// an HMAC over that stage, the tenant, the invocation id and the ingest
// sequence under the key the handing stage and audit share (the pair key
// of mac.go), which no other role can make. Authorize makes route's, and
// control's for a call it parks (kept in the approval record, which only
// authorize and control read); route makes execute's, execute verify's.
// Every stage may read TOOLGATE_PIPELINE by sequence for its sweep, so a
// custody in a hop is readable by them all: naming its holder makes a
// copy useless to any other. Audit takes an ending from route, execute or
// verify, or control's ending of a parked call, only with the sender's
// own custody of that very call. It costs a hash per hand-off and one at
// audit per call, in one process or many. An ending this process signed
// is checked too: an honest execute of this process ends, with E3218, a
// hop a compromised route host forged, and that ending must not take the
// id.

// custodian is the role that hands holder its calls, and so makes its
// custody: "" for a role that holds no custody.
func custodian(holder busauth.Role) busauth.Role {
	switch holder {
	case busauth.RoleRoute, busauth.RoleControl:
		return busauth.RoleAuthorize
	case busauth.RoleExecute:
		return busauth.RoleRoute
	case busauth.RoleVerify:
		return busauth.RoleExecute
	}
	if _, ok := busauth.SiteOfRole(holder); ok {
		return busauth.RoleRoute
	}
	return ""
}

// A site's worker holds its own key (busauth.SiteRole), not execute's: route
// hands a site's call to "execute@<site>", so that custody names the site,
// and the site makes verify's custody with its own key. Verify reads no
// custody (only audit holds the keys to check one), so route also binds the
// call to its site for verify (SiteBinding, under the key route and verify
// share): a site hands verify only calls route sent to that site.

// makesCustody reports whether s's role makes holder's custody: its
// custodian's, or a site's of verify for the calls it runs.
func (s *Signer) makesCustody(holder busauth.Role) bool {
	if holder == busauth.RoleVerify {
		if _, site := busauth.SiteOfRole(s.role); site {
			return true
		}
	}
	return custodian(holder) == s.role
}

// Custody returns holder's custody of the call (tenant, id, seq), made by
// s, or "" when s's role does not hand holder its calls or s has no pair
// keys (NewSigner of Messages).
func (s *Signer) Custody(holder busauth.Role, tenant, id string, seq uint64) string {
	if s == nil || s.pairs == nil || !s.makesCustody(holder) {
		return ""
	}
	k, ok := s.pairs.key(s.role, busauth.RoleAudit, s.role)
	if !ok {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString(mac(k, custodyText(holder, tenant, id, seq)))
}

// EndingTag is what s's role adds to the message id of a hand-off into
// audit (runner.EndingID): a MAC over its role, the tenant, the invocation
// id and the ingest sequence under its pair key with audit, or "" without
// pair keys. JetStream keeps the first message of an id and drops later
// ones as duplicates, and the id of a call's hop into audit is otherwise
// predictable; any role that may publish there could then send a refused
// forgery under it first and make audit's input drop the real ending. A
// tag only the sender's role can make keeps its id its own, and a
// redelivery of its own hand-off still takes the same id.
func (s *Signer) EndingTag(tenant, id string, seq uint64) string {
	if s == nil || s.pairs == nil {
		return ""
	}
	k, ok := s.pairs.key(s.role, busauth.RoleAudit, s.role)
	if !ok {
		return ""
	}
	text := append([]byte(endingTagVersion+"\n"), custodyText(s.role, tenant, id, seq)...)
	return base64.RawURLEncoding.EncodeToString(mac(k, text)[:12])
}

// endingTagVersion sets an ending tag's text apart from a custody's,
// which the same key makes.
const endingTagVersion = "toolgate-ending-id-v1"

func custodyText(holder busauth.Role, tenant, id string, seq uint64) []byte {
	b := make([]byte, 0, len(custodyVersion)+len(holder)+len(tenant)+len(id)+32)
	b = append(b, custodyVersion...)
	b = append(append(b, '\n'), holder...)
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
// or control, carry sender's own custody of this call (Signer.Custody).
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
		if _, site := busauth.SiteOfRole(sender); !site {
			return refuseEnding(sender, inv, "role "+string(sender)+" ends no call")
		}
		stage = subjects.Execute // a site's worker ends calls as execute
	}
	if inv.EndedBy != stage {
		return refuseEnding(sender, inv, "an ending by "+strconv.Quote(inv.EndedBy)+" is not "+string(sender)+"'s to hand on")
	}
	if sender == busauth.RoleValidate || sender == busauth.RoleAuthorize {
		return nil // they take every call first
	}
	by := custodian(sender)
	if sender == busauth.RoleVerify && inv.Route != nil && inv.Route.Site != "" {
		// Verify checked that the site's call came from its site
		// (HandOff); that site made verify's custody.
		by = busauth.SiteRole(inv.Route.Site)
		m.key(by) // learns a site declared since this process started
	}
	if inv.Custody == "" {
		return refuseEnding(sender, inv, "it carries no custody of "+string(sender)+": the call was never handed to "+string(sender))
	}
	k, ok := m.pairs.key(by, busauth.RoleAudit, busauth.RoleAudit)
	if !ok {
		return refuseEnding(sender, inv, "this process holds no key of audit to check "+string(by)+"'s custody")
	}
	holder := sender
	if sender == busauth.RoleExecute && inv.Route != nil && inv.Route.Site != "" && inv.Error != nil && (inv.Error.ECode == api.EDeliveryExhausted || inv.Error.ECode == api.ESiteRemoved) {
		// The hub's execute ends a site's call whose message reached the
		// delivery limit (the site may not read it by sequence), or that
		// waited for a site since removed: with route's custody of the call
		// for that site, and those endings only.
		holder = busauth.SiteRole(inv.Route.Site)
	}
	raw, err := base64.RawURLEncoding.DecodeString(inv.Custody)
	want := custodyText(holder, inv.Tenant, inv.ID, inv.Event.Seq)
	held := err == nil && k.equal(raw, want)
	if _, site := busauth.SiteOfRole(by); !held && err == nil && site && m.reload() {
		// The site may have been declared again since its key was read.
		if k, ok = m.pairs.key(by, busauth.RoleAudit, busauth.RoleAudit); ok {
			held = k.equal(raw, want)
		}
	}
	if !held {
		return refuseEnding(sender, inv, "its custody is not the one "+string(by)+" hands "+string(sender)+" for this tenant, invocation and sequence: the call was never handed to "+string(sender))
	}
	return nil
}

// SiteBinding returns route's binding of the call (tenant, id, seq) to
// site, for verify (Route.SiteBinding), or "" when s is not route's or
// has no pair keys.
func (s *Signer) SiteBinding(site, tenant, id string, seq uint64) string {
	if s == nil || s.pairs == nil || s.role != busauth.RoleRoute {
		return ""
	}
	k, ok := s.pairs.key(busauth.RoleRoute, busauth.RoleVerify, busauth.RoleRoute)
	if !ok {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString(mac(k, siteBindingText(site, tenant, id, seq)))
}

// siteBindingVersion sets a binding's text apart from a hand-off's under
// the same key.
const siteBindingVersion = "toolgate-site-binding-v1"

func siteBindingText(site, tenant, id string, seq uint64) []byte {
	return append([]byte(siteBindingVersion+"\n"), custodyText(busauth.SiteRole(site), tenant, id, seq)...)
}

// HandOff returns nil when sender, whose signature on a hand-off to
// verify Check verified, may hand verify inv, else a permission_denied
// *api.Error (E3272): a site's worker only a call route sent to that
// very site (Route.Site and route's SiteBinding of it), the hub's execute
// only a call of the hub's.
func (m *Messages) HandOff(sender busauth.Role, inv *envelope.Invocation) error {
	routed := ""
	if inv.Route != nil {
		routed = inv.Route.Site
	}
	site, isSite := busauth.SiteOfRole(sender)
	switch {
	case !isSite && routed == "":
		return nil
	case !isSite:
		return refuseHandOff(sender, inv, "the call is site "+strconv.Quote(routed)+"'s, not the hub's")
	case routed != site:
		return refuseHandOff(sender, inv, "route sent the call to "+siteName(routed)+", not to site "+strconv.Quote(site))
	}
	k, ok := m.pairs.key(busauth.RoleRoute, busauth.RoleVerify, busauth.RoleVerify)
	if !ok {
		return refuseHandOff(sender, inv, "this process holds no key of verify to check route's binding")
	}
	raw, err := base64.RawURLEncoding.DecodeString(inv.Route.SiteBinding)
	if err != nil || !k.equal(raw, siteBindingText(site, inv.Tenant, inv.ID, inv.Event.Seq)) {
		return refuseHandOff(sender, inv, "it carries no binding route made of this tenant, invocation and sequence to site "+strconv.Quote(site)+": route never sent it the call")
	}
	return nil
}

func siteName(site string) string {
	if site == "" {
		return "the hub"
	}
	return "site " + strconv.Quote(site)
}

func refuseHandOff(sender busauth.Role, inv *envelope.Invocation, why string) error {
	return api.NewError(api.PermissionDenied, api.ESiteHandOffRefused, "verify refused the hand-off of invocation %q from %s: %s",
		inv.ID, sender, why).WithDetail("invocation_id", inv.ID).WithDetail("sender", string(sender))
}

func refuseEnding(sender busauth.Role, inv *envelope.Invocation, why string) error {
	code := ""
	if inv.Error != nil {
		code = " " + inv.Error.ECode
	}
	return api.NewError(api.PermissionDenied, api.EEndingRefused, "audit refused the ending of invocation %q (%s%s, ended by %q) from %s: %s",
		inv.ID, inv.Status, code, inv.EndedBy, sender, why).WithDetail("invocation_id", inv.ID).WithDetail("sender", string(sender))
}
