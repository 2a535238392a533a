// Package busauth is who may do what on toolgate's NATS bus.
//
// Every connection is authenticated by an auth callout service (nats-server's
// `authorization { auth_callout {…} }`): the server forwards each CONNECT on
// $SYS.REQ.USER.AUTH, the service checks the credentials and answers with a
// user JWT that places the connection in an account and carries its subject
// permissions. The roles:
//
//   - agent: connects with its capability token as the NATS connect token;
//     lives in its tenant's account (TenantAccount), which imports from
//     account TOOLGATE only that tenant's invoke subject, control services,
//     results and audit, and within it may use only its own inbox prefix.
//   - one role per stage (validate, authorize, route, execute, verify,
//     audit), in account TOOLGATE: each pulls from its own durable
//     consumers, publishes its own hand-offs and events, and reads and
//     writes only the buckets its work needs (Rights).
//   - control: the control service; its endpoints, the buckets it writes,
//     and the hops a decision or cancel puts into the pipeline.
//   - operator: administration (account TOOLGATE); everything there,
//     the topology (streams, consumers, buckets) included. Its documented
//     path for every change is the control service's administrative
//     endpoints (signed requests, audited).
//
// No role but the operator's may create, change or delete streams or
// consumers (see RoleRights).
//
// Stage processes, the control service and operators present a NATS .creds file whose user JWT toolgate
// issued (WriteCredentials); the callout verifies it and the nonce signature.
// The mapping from an Identity to an account and permissions (Grant) is pure
// and is the only one: the embedded server and external servers both load
// the same configuration text (ServerConfig) and the same callout.
//
// The package depends on no stage, store or command package of toolgate:
// it declares the narrow interfaces it needs (TokenVerifier, Auditor, Kicker).
package busauth

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/toolgate/toolgate/subjects"
)

// Role is what a connection may do.
type Role string

// The roles: an agent, one per stage, the control service and the operator.
const (
	RoleAgent     Role = "agent"
	RoleValidate  Role = "validate"
	RoleAuthorize Role = "authorize"
	RoleRoute     Role = "route"
	RoleExecute   Role = "execute"
	RoleVerify    Role = "verify"
	RoleAudit     Role = "audit"
	RoleControl   Role = "control"
	RoleOperator  Role = "operator"
	// The people's roles (PeopleRights): each credential is one named
	// person's own, issued with `toolgate creds issue --role R --name N`.
	RoleApprover Role = "approver"
	RoleAuditor  Role = "auditor"
	RoleAdmin    Role = "admin"
)

// PeopleRoles are the roles of people, whose credentials name a person.
var PeopleRoles = []Role{RoleApprover, RoleAuditor, RoleAdmin}

// StageRoles are the roles of the six stages, in pipeline order; a stage's
// role has the stage's name.
var StageRoles = []Role{RoleValidate, RoleAuthorize, RoleRoute, RoleExecute, RoleVerify, RoleAudit}

// IssuedRoles are the roles serve writes local credentials for; people's
// roles (PeopleRoles) are issued to named persons only.
var IssuedRoles = append(append([]Role{}, StageRoles...), RoleControl, RoleOperator)

// StageRole is the role of the named stage.
func StageRole(stage string) (Role, bool) {
	r := Role(stage)
	return r, slices.Contains(StageRoles, r)
}

// Issued reports whether r is a role credentials are issued for.
func (r Role) Issued() bool { return slices.Contains(IssuedRoles, r) || r.Person() || r == RoleSite }

// Person reports whether r is a person's role.
func (r Role) Person() bool { return slices.Contains(PeopleRoles, r) }

// Stage reports whether r is a stage's role.
func (r Role) Stage() bool { return slices.Contains(StageRoles, r) }

// RoleInbox is the inbox prefix of a connection of an issued role
// (nats.CustomInboxPrefix; CredentialsOption sets it): each role may
// subscribe below its own only, so none reads another's replies (pull
// responses carry whole invocations).
func RoleInbox(r Role) string { return "_INBOX." + string(r) }

// Account names. Agents live apart from toolgate's own account, each
// tenant's in its own (TenantAccount), so that a reply subject an agent
// chooses can name neither a subject inside TOOLGATE nor another tenant's
// inbox: the server maps replies of cross-account service requests to
// private _R_ subjects, delivers the answer in the requester's account, and
// stamps each request with a Nats-Request-Info header naming the caller.
const (
	AccountToolgate = "TOOLGATE"
	AccountAuth     = "AUTH"
	AccountSystem   = "SYS"
)

// Identity is an authenticated principal.
type Identity struct {
	Role Role
	// Name names the principal: the worker's or operator's name from its
	// credentials, the agent's token subject (agent DID) for an agent.
	Name string
	// Tenant and TokenID (jti) are set for agents.
	Tenant  string
	TokenID string
	// TenantReader is set for an agent whose token opts in to seeing every
	// call of its tenant (the tenant_reader claim); any other agent sees
	// only its own agent's calls.
	TenantReader bool
	// Chain lists the ids of the tokens an agent's token was derived from;
	// revoking any of them closes the connection.
	Chain []string
	// Expires ends the connection; zero never.
	Expires time.Time
}

// tenantReaderMark ends the user name of an agent with the tenant_reader
// claim.
const tenantReaderMark = "tenant_reader"

// UserName is the name the server reports for the connection (in
// Nats-Request-Info, connz, logs): "<role>:<name>", for agents
// "agent:<tenant>:<jti>:<agent>", with ":tenant_reader" appended for a
// tenant reader; jti and agent are encoded with subjects.Token (a UUID
// stays as it is, "did:example:a" is "did=3Aexample=3Aa"). It is what an
// approval records as the decider, and how the control service knows whose
// calls an agent may see.
func (id Identity) UserName() string {
	if id.Role == RoleAgent {
		s := string(RoleAgent) + ":" + id.Tenant + ":" + subjects.Token(id.TokenID) + ":" + subjects.Token(id.Name)
		if id.TenantReader {
			s += ":" + tenantReaderMark
		}
		return s
	}
	return string(id.Role) + ":" + id.Name
}

// ParseUserName reverses UserName; it is how a service reads the caller from
// a Nats-Request-Info header's user name. An agent's Name is its agent DID.
func ParseUserName(s string) (Identity, error) {
	role, rest, ok := strings.Cut(s, ":")
	if !ok || rest == "" {
		return Identity{}, fmt.Errorf("user name %q is not role:name", s)
	}
	switch Role(role) {
	case RoleAgent:
		parts := strings.Split(rest, ":")
		if len(parts) < 3 || len(parts) > 4 || parts[0] == "" || parts[1] == "" || parts[2] == "" ||
			(len(parts) == 4 && parts[3] != tenantReaderMark) {
			return Identity{}, fmt.Errorf("agent user name %q is not agent:tenant:jti:agent[:%s]", s, tenantReaderMark)
		}
		jti, err := subjects.Untoken(parts[1])
		if err != nil {
			return Identity{}, fmt.Errorf("agent user name %q: token id: %w", s, err)
		}
		agent, err := subjects.Untoken(parts[2])
		if err != nil {
			return Identity{}, fmt.Errorf("agent user name %q: agent: %w", s, err)
		}
		return Identity{Role: RoleAgent, Name: agent, Tenant: parts[0], TokenID: jti, TenantReader: len(parts) == 4}, nil
	default:
		if r := Role(role); r.Issued() {
			return Identity{Role: r, Name: rest}, nil
		}
	}
	return Identity{}, fmt.Errorf("user name %q has unknown role %q", s, role)
}

// InboxPrefix is the inbox prefix an agent must use (nats.CustomInboxPrefix,
// `nats --inbox-prefix`): _INBOX.<tenant>.<token id>, the token id encoded
// with subjects.Token. Only that connection's token may subscribe below it,
// so no agent reads another's replies.
func InboxPrefix(tenant, jti string) string {
	return "_INBOX." + tenant + "." + subjects.Token(jti)
}

// agentServices are the control endpoints an agent may call, each served on
// subjects.TenantSvc(tenant, endpoint).
var agentServices = subjects.TenantServices

// Grant is what the callout gives a connection: its account and permissions.
type Grant struct {
	Account     string
	Permissions jwt.Permissions
}

// ErrBadIdentity is returned by GrantFor for an identity no role can take.
var ErrBadIdentity = errors.New("busauth: identity cannot be granted")

// GrantFor maps id to its account and subject permissions. It is the one
// mapping from credentials to rights; it is pure.
func GrantFor(id Identity) (Grant, error) {
	switch id.Role {
	case RoleAgent:
		if err := checkToken("tenant", id.Tenant); err != nil {
			return Grant{}, err
		}
		// The tenant names an account: only plain names.
		if err := subjects.CheckTenant(id.Tenant); err != nil {
			return Grant{}, fmt.Errorf("%w: %v", ErrBadIdentity, err)
		}
		if id.TokenID == "" {
			return Grant{}, fmt.Errorf("%w: agent without token id", ErrBadIdentity)
		}
		return Grant{Account: TenantAccount(id.Tenant), Permissions: agentPermissions(id)}, nil
	case RoleOperator:
		return Grant{Account: AccountToolgate, Permissions: operatorPermissions()}, nil
	case RoleSite:
		if err := subjects.CheckSite(id.Name); err != nil {
			return Grant{}, fmt.Errorf("%w: %v", ErrBadIdentity, err)
		}
		return Grant{Account: AccountToolgate, Permissions: sitePermissions(id.Name)}, nil
	}
	if r, ok := PeopleRights[id.Role]; ok {
		// The name is part of the person's inbox prefix.
		if err := checkToken("name", id.Name); err != nil {
			return Grant{}, err
		}
		return Grant{Account: AccountToolgate, Permissions: r.permissions(id.Role, id.Name)}, nil
	}
	if r, ok := Rights[id.Role]; ok {
		return Grant{Account: AccountToolgate, Permissions: r.permissions(id.Role)}, nil
	}
	return Grant{}, fmt.Errorf("%w: unknown role %q", ErrBadIdentity, id.Role)
}

// checkToken requires s to be one literal subject token.
func checkToken(what, s string) error {
	if s == "" || strings.ContainsAny(s, ".*> \t\r\n") || s == subjects.SystemTenant {
		return fmt.Errorf("%w: %s %q is not a plain subject token", ErrBadIdentity, what, s)
	}
	return nil
}

// agentPermissions are an agent's: its tenant's invoke subject and control
// endpoints, and the results of its own agent's calls (the agent is in the
// result subject), or of the whole tenant's for a tenant reader. Live audit
// events carry no agent in their subject, so only a tenant reader may
// subscribe to them; any other agent reads its own calls' events from its
// tenant's audit.history endpoint, which filters them.
func agentPermissions(id Identity) jwt.Permissions {
	tenant := id.Tenant
	var p jwt.Permissions
	p.Pub.Allow.Add(subjects.Invoke(tenant))
	for _, svc := range agentServices {
		p.Pub.Allow.Add(subjects.TenantSvc(tenant, svc))
	}
	results := subjects.ResultAgent(tenant, id.Name)
	if id.TenantReader {
		results = resultsOf(tenant)
		p.Sub.Allow.Add(subjects.AuditTenant(tenant))
	}
	// A late reader fetches a result by its subject (last message on it).
	p.Pub.Allow.Add(directGet(results))
	p.Sub.Allow.Add(results, InboxPrefix(tenant, id.TokenID)+".>")
	return p
}

// directGet is the JetStream direct-get subject that returns the last
// message of a result subject matching results:
// $JS.API.DIRECT.GET.<stream>.<subject>.
func directGet(results string) string {
	return "$JS.API.DIRECT.GET." + subjects.StreamResults + "." + results
}

// directGetResult matches the direct gets of every result of tenant, what
// its account imports.
func directGetResult(tenant string) string { return directGet(resultsOf(tenant)) }

// operatorPermissions: everything inside account TOOLGATE but writing the
// trail: only audit publishes audit events and results (TrailSubjects).
func operatorPermissions() jwt.Permissions {
	var p jwt.Permissions
	p.Pub.Allow.Add(">")
	p.Pub.Deny.Add(TrailSubjects...)
	p.Sub.Allow.Add(">")
	return p
}

// TrailSubjects are the subjects only the audit role may publish on: the
// audit events and the results. Every other credential, the operator's
// included, is denied them by the server.
var TrailSubjects = []string{subjects.AuditAll, subjects.ResultAll}
