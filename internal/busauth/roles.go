// Package busauth is who may do what on toolgate's NATS bus.
//
// Every connection is authenticated by an auth callout service (nats-server's
// `authorization { auth_callout {…} }`): the server forwards each CONNECT on
// $SYS.REQ.USER.AUTH, the service checks the credentials and answers with a
// user JWT that places the connection in an account and carries its subject
// permissions. Four roles exist:
//
//   - agent: connects with its capability token as the NATS connect token;
//     lives in account AGENTS, which sees only what account TOOLGATE exports
//     (invoke, tenant-scoped control services, results, audit), and within it
//     only its own tenant's subjects and its own inbox prefix.
//   - worker: stage processes (account TOOLGATE); the pipeline, their
//     streams, consumers and the buckets stages write; no stream deletion or
//     purge, no writes to tools, models, policies or revocations, and no
//     control endpoints (it can neither serve nor call them).
//   - control: the control service (account TOOLGATE); its endpoints, the
//     buckets it writes (tools, approvals, invocations, capabilities, and
//     for the operators' administrative endpoints policies, hooks,
//     revocations, breakers and models), and the hops a decision or cancel
//     puts into the pipeline.
//   - operator: administration (account TOOLGATE); everything there. Its
//     documented path for every change is the control service's
//     administrative endpoints (signed requests, audited); stream and
//     bucket administration stay its own.
//
// Workers and operators present a NATS .creds file whose user JWT toolgate
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
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/toolgate/toolgate/subjects"
)

// Role is what a connection may do.
type Role string

// The roles.
const (
	RoleAgent    Role = "agent"
	RoleWorker   Role = "worker"
	RoleControl  Role = "control"
	RoleOperator Role = "operator"
)

// IssuedRoles are the roles toolgate issues credentials for.
var IssuedRoles = []Role{RoleWorker, RoleControl, RoleOperator}

// Issued reports whether r is a role credentials are issued for.
func (r Role) Issued() bool { return r == RoleWorker || r == RoleControl || r == RoleOperator }

// Account names. Agents live apart from toolgate's own account so that a
// reply subject an agent chooses can never name a subject inside TOOLGATE:
// the server maps replies of cross-account service requests to private
// _R_ subjects, and stamps each request with a Nats-Request-Info header
// naming the caller.
const (
	AccountToolgate = "TOOLGATE"
	AccountAgents   = "AGENTS"
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
	// Chain lists the ids of the tokens an agent's token was derived from;
	// revoking any of them closes the connection.
	Chain []string
	// Expires ends the connection; zero never.
	Expires time.Time
}

// UserName is the name the server reports for the connection (in
// Nats-Request-Info, connz, logs): "<role>:<name>", for agents
// "agent:<tenant>:<jti>". It is what an approval records as the decider.
func (id Identity) UserName() string {
	if id.Role == RoleAgent {
		return string(RoleAgent) + ":" + id.Tenant + ":" + id.TokenID
	}
	return string(id.Role) + ":" + id.Name
}

// ParseUserName reverses UserName; it is how a service reads the caller from
// a Nats-Request-Info header's user name.
func ParseUserName(s string) (Identity, error) {
	role, rest, ok := strings.Cut(s, ":")
	if !ok || rest == "" {
		return Identity{}, fmt.Errorf("user name %q is not role:name", s)
	}
	switch Role(role) {
	case RoleAgent:
		tenant, jti, ok := strings.Cut(rest, ":")
		if !ok || tenant == "" || jti == "" {
			return Identity{}, fmt.Errorf("agent user name %q is not agent:tenant:jti", s)
		}
		return Identity{Role: RoleAgent, Name: s, Tenant: tenant, TokenID: jti}, nil
	case RoleWorker, RoleControl, RoleOperator:
		return Identity{Role: Role(role), Name: rest}, nil
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

// Bucket names toolgate's KV buckets use. They mirror kvstore's constants
// (which this package may not import; TestBucketNames checks them); stream
// names are KV_<bucket>.
const (
	bucketTools        = "toolgate_tools"
	bucketPolicies     = "toolgate_policies"
	bucketRevocations  = "toolgate_revocations"
	bucketInvocations  = "toolgate_invocations"
	bucketApprovals    = "toolgate_approvals"
	bucketBudgets      = "toolgate_budgets"
	bucketRateLimits   = "toolgate_ratelimits"
	bucketIdempotency  = "toolgate_idempotency"
	bucketCheckpoints  = "toolgate_checkpoints"
	bucketBreakers     = "toolgate_breakers"
	bucketToolStats    = "toolgate_toolstats"
	bucketModelStats   = "toolgate_modelstats"
	bucketCapabilities = "toolgate_capabilities"
	bucketHooks        = "toolgate_hooks"
)

// workerBuckets are the buckets stage processes write: status records and
// hook decisions (validate, authorize, execute, audit), approvals requested
// and expired (authorize), budgets and aborted sessions (authorize, audit),
// rate limits (route), idempotency keys, checkpoints and breakers
// (execute), tool usage statistics (audit), model statistics (execute),
// and the recorded security settings (every authorize and execute
// process). Hook sets, policies, revocations and models are written by the
// control service for operators.
var workerBuckets = []string{bucketInvocations, bucketApprovals, bucketBudgets, bucketRateLimits,
	bucketIdempotency, bucketCheckpoints, bucketBreakers, subjects.BucketSettings, bucketToolStats,
	bucketModelStats}

// controlBuckets are the buckets the control service writes: tools
// (register, delete), approvals (decisions), invocations (cancels),
// capability requests with their grants, and what operators change through
// its administrative endpoints: policies, hook sets, revocations, forced
// breakers and the model catalogue.
var controlBuckets = []string{bucketTools, bucketApprovals, bucketInvocations, bucketCapabilities,
	bucketPolicies, bucketHooks, bucketRevocations, bucketBreakers, subjects.BucketModels}

// agentServices are the control endpoints an agent may call, each served on
// subjects.TenantSvc(tenant, endpoint).
var agentServices = []string{subjects.SvcStatus, subjects.SvcCancel, subjects.SvcToolsList, subjects.SvcToolsGet,
	subjects.SvcBudget, subjects.SvcApprovalsList, subjects.SvcApprovalsGet,
	subjects.SvcCapabilityRequest, subjects.SvcCapabilityReport}

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
		if id.TokenID == "" {
			return Grant{}, fmt.Errorf("%w: agent without token id", ErrBadIdentity)
		}
		return Grant{Account: AccountAgents, Permissions: agentPermissions(id.Tenant, id.TokenID)}, nil
	case RoleWorker:
		return Grant{Account: AccountToolgate, Permissions: workerPermissions()}, nil
	case RoleControl:
		return Grant{Account: AccountToolgate, Permissions: controlPermissions()}, nil
	case RoleOperator:
		return Grant{Account: AccountToolgate, Permissions: operatorPermissions()}, nil
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

func agentPermissions(tenant, jti string) jwt.Permissions {
	var p jwt.Permissions
	p.Pub.Allow.Add(subjects.Invoke(tenant))
	for _, svc := range agentServices {
		p.Pub.Allow.Add(subjects.TenantSvc(tenant, svc))
	}
	// A late reader fetches a result by its subject (last message on it).
	p.Pub.Allow.Add(directGetResult(tenant))
	p.Sub.Allow.Add(
		subjects.ResultAll[:len(subjects.ResultAll)-1]+tenant+".>",
		subjects.AuditTenant(tenant),
		InboxPrefix(tenant, jti)+".>",
	)
	return p
}

// directGetResult is the JetStream direct-get subject that returns the last
// message of a result subject of tenant: $JS.API.DIRECT.GET.<stream>.<subject>.
func directGetResult(tenant string) string {
	return "$JS.API.DIRECT.GET." + subjects.StreamResults + "." + subjects.ResultAll[:len(subjects.ResultAll)-1] + tenant + ".>"
}

// jsReadAndConsume are the JetStream API subjects every toolgate process
// uses: account and stream information, creating missing streams and
// buckets at start (never updating, purging or deleting them, so no worker
// can shorten or erase the audit trail), reading messages, consumers (pull
// consumers and KV watches), acks and flow control.
var jsReadAndConsume = []string{
	"$JS.API.INFO",
	"$JS.API.STREAM.INFO.>",
	"$JS.API.STREAM.NAMES",
	"$JS.API.STREAM.LIST",
	"$JS.API.STREAM.CREATE.>",
	"$JS.API.STREAM.MSG.GET.>",
	"$JS.API.DIRECT.GET.>",
	"$JS.API.CONSUMER.>",
	"$JS.ACK.>",
	"$JS.FC.>",
}

func kvWrites(buckets []string) []string {
	out := make([]string, 0, len(buckets))
	for _, b := range buckets {
		out = append(out, "$KV."+b+".>")
	}
	return out
}

// workerPermissions are the rights stage processes use: the pipeline and
// its ends (results, audit), the buckets stages write, cancel
// announcements heard. Not the control endpoints, whose subscriptions would
// let a worker answer for the control service, nor the tools, models,
// policies and revocations buckets.
func workerPermissions() jwt.Permissions {
	var p jwt.Permissions
	p.Pub.Allow.Add(
		subjects.InvokeAll, // the bench and re-submission
		subjects.PipeAll,
		subjects.ResultAll,
		subjects.AuditAll,
		"_INBOX.>",
	)
	p.Pub.Allow.Add(jsReadAndConsume...)
	p.Pub.Allow.Add("$JS.API.STREAM.MSG.DELETE."+subjects.StreamInvoke,
		"$JS.API.STREAM.MSG.DELETE."+subjects.StreamPipeline)
	p.Pub.Allow.Add(kvWrites(workerBuckets)...)
	p.Sub.Allow.Add(
		subjects.InvokeAll, subjects.PipeAll, subjects.ResultAll, subjects.AuditAll, subjects.CancelAll,
		"_INBOX.>",
		"$JS.EVENT.ADVISORY.>",
	)
	p.Resp = &jwt.ResponsePermission{MaxMsgs: 1, Expires: time.Minute}
	return p
}

// controlPermissions are the control service's rights: serve the control
// endpoints (and micro's discovery), write controlBuckets, announce
// cancels, and put a decided or cancelled call back into the pipeline (to
// authorize, or to audit) with its audit event. It reads what the stages write (status, budgets, streams in
// flight) but cannot hand a call to route, execute or verify.
func controlPermissions() jwt.Permissions {
	var p jwt.Permissions
	p.Pub.Allow.Add(
		subjects.PipeStage(subjects.Authorize),
		subjects.PipeStage(subjects.Audit),
		subjects.AuditAll,
		subjects.CancelAll,
		"tool.svc.>",
		"$SRV.>",
		"_INBOX.>",
	)
	p.Pub.Allow.Add(jsReadAndConsume...)
	p.Pub.Allow.Add(kvWrites(controlBuckets)...)
	p.Sub.Allow.Add(
		"tool.svc.>", "$SRV.>", "_INBOX.>",
		"$JS.EVENT.ADVISORY.>",
	)
	p.Resp = &jwt.ResponsePermission{MaxMsgs: 1, Expires: time.Minute}
	return p
}

// operatorPermissions: everything inside account TOOLGATE.
func operatorPermissions() jwt.Permissions {
	var p jwt.Permissions
	p.Pub.Allow.Add(">")
	p.Sub.Allow.Add(">")
	return p
}
