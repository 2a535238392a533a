package busauth

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/toolgate/toolgate/subjects"
)

// PersonRights are what a person's role may do on the bus. A person calls
// control endpoints (the control service does the writing) and, to read
// the trail, gets AUDIT's and AUDIT_CHAIN's messages one by one (direct
// gets) and hears audit events live: never a consumer, whose deliver
// subject JetStream does not check, and never a bucket. The control
// service checks the role again on every signed request (Signs).
type PersonRights struct {
	// Calls are the control endpoints the role may call in toolgate's own
	// account (subjects.ControlEndpoints' Subject).
	Calls []string
	// TenantCalls are tenant-scoped endpoints it may call for any tenant,
	// on subjects.TenantSvc(tenant, endpoint).
	TenantCalls []string
	// ReadsTrail: direct gets and stream information of AUDIT and
	// AUDIT_CHAIN, and live audit events (audit.>).
	ReadsTrail bool
	// Signs are the endpoints whose signed requests the control service
	// takes from the role; any other signed request of the role is
	// refused (E3245) and audited.
	Signs []string
}

// PersonInbox is the inbox prefix of a person's connection
// (CredentialsOption sets it): _INBOX.<role>.<name>, so that no person
// reads another's replies.
func PersonInbox(r Role, name string) string { return RoleInbox(r) + "." + name }

// adminCalls are the administrative endpoints and the tool catalogue's
// writes: everything an admin changes.
var adminCalls = slices.Concat(subjects.AdminServices, []string{subjects.SvcToolsRegister, subjects.SvcToolsDelete, subjects.SvcToolsPurge})

// PeopleRights are the rights of each person's role.
var PeopleRights = map[Role]PersonRights{
	// approver lists, shows and decides approvals, reads calls' status
	// and the trail.
	RoleApprover: {
		Calls:       []string{subjects.SvcApprovalsList, subjects.SvcApprovalsGet, subjects.SvcApproval, subjects.SvcStatus},
		TenantCalls: []string{subjects.SvcApprovalsList, subjects.SvcApprovalsGet, subjects.SvcStatus, subjects.SvcAuditHistory},
		ReadsTrail:  true,
		Signs:       []string{subjects.SvcApproval},
	},
	// auditor reads: the trail, calls' status and their run reports
	// (receipts); it decides nothing and changes nothing.
	RoleAuditor: {
		Calls:       []string{subjects.SvcStatus, subjects.SvcCapabilityReport, subjects.SvcReceipt},
		TenantCalls: []string{subjects.SvcStatus, subjects.SvcAuditHistory, subjects.SvcCapabilityReport, subjects.SvcReceipt},
		ReadsTrail:  true,
	},
	// admin changes what calls may do: tools, policy (and its shadow),
	// hooks, models, document sources, re-drives, breakers, revocations.
	// Rotating keys is done on the deployment's files, not on the bus.
	RoleAdmin: {
		Calls: slices.Concat([]string{subjects.SvcToolsList, subjects.SvcToolsGet, subjects.SvcToolsStats, subjects.SvcModelsStats,
			subjects.SvcStatus}, adminCalls),
		TenantCalls: []string{subjects.SvcStatus},
		Signs:       adminCalls,
	},
}

// MaySign reports whether the control service takes a signed request on
// subject from role: a person's role only for its Signs; the operator for
// every one (break-glass, audited as such).
func MaySign(role Role, subject string) bool {
	if role == RoleOperator {
		return true
	}
	r, ok := PeopleRights[role]
	return ok && slices.Contains(r.Signs, subject)
}

// BreakGlass reports whether a signed change by role is a use of the
// operator credential, which the trail flags.
func BreakGlass(role Role) bool { return role == RoleOperator }

// permissions turns a person's rights into subject permissions.
func (r PersonRights) permissions(role Role, name string) jwt.Permissions {
	var p jwt.Permissions
	p.Sub.Allow.Add(PersonInbox(role, name) + ".>")
	for _, c := range r.Calls {
		p.Pub.Allow.Add(c)
	}
	for _, c := range r.TenantCalls {
		p.Pub.Allow.Add(subjects.TenantSvc("*", c))
	}
	if r.ReadsTrail {
		for _, st := range []string{subjects.StreamAudit, subjects.StreamAuditChain} {
			p.Pub.Allow.Add("$JS.API.STREAM.INFO."+st, subjects.DirectGet(st), subjects.DirectGet(st)+".>")
		}
		// The checkpoints' stream takes no direct gets: `audit verify`
		// reads it by sequence from its leader.
		p.Pub.Allow.Add(subjects.MsgGet(subjects.StreamAuditChain))
		p.Sub.Allow.Add(subjects.AuditAll)
	}
	// Never the trail's writer, whatever the allows above become.
	p.Pub.Deny.Add(TrailSubjects...)
	return p
}

// PeopleTable renders PeopleRights as the Markdown table of people's roles
// in docs/security.md (a test holds the page to it).
func PeopleTable() string {
	var b strings.Builder
	b.WriteString("| role | calls (control endpoints) | signed requests taken from it | reads the trail |\n")
	b.WriteString("|---|---|---|---|\n")
	for _, role := range PeopleRoles {
		r := PeopleRights[role]
		calls := slices.Clone(r.Calls)
		for _, c := range r.TenantCalls {
			calls = append(calls, subjects.TenantSvc("*", c))
		}
		trail := "—"
		if r.ReadsTrail {
			trail = fmt.Sprintf("direct gets of `%s` and `%s`, `%s` by sequence, hears `%s`", subjects.StreamAudit, subjects.StreamAuditChain, subjects.StreamAuditChain, subjects.AuditAll)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", role, codeList(calls), codeList(r.Signs), trail)
	}
	fmt.Fprintf(&b, "| operator | everything in `%s` but publishing on %s (break-glass) | every one, audited as `break_glass` | everything |\n",
		AccountToolgate, codeList(TrailSubjects))
	return b.String()
}

// SignerRole is the role and name the credentials of s name ("" when
// they name none).
func SignerRole(s *Signer) (Role, string) {
	uc, err := jwt.DecodeUserClaims(s.JWT)
	if err != nil {
		return "", ""
	}
	return roleOf(uc), uc.Name
}
