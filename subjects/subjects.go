// Package subjects is the one place that names toolgate's NATS topology: every
// subject, stream, consumer and service endpoint. Nothing else in the code base
// spells a subject; it asks this package.
//
// The public subjects (the contract in docs/contract.md):
//
//	tool.invoke.<tenant>                  tool.invoke CloudEvents in (stream TOOLGATE_INVOKE)
//	tool.result.<tenant>.<agent>.<invocation>  one ToolInvokeResponse per invocation (stream TOOLGATE_RESULTS)
//	audit.<tenant>.<event>                audit CloudEvents (stream AUDIT, append-only)
//	toolgate.auditchain.checkpoint        signed checkpoints over AUDIT (stream AUDIT_CHAIN)
//	tool.svc.*                            request-reply control services (nats micro)
//
// Internal hand-offs between stages travel on
// toolgate.pipe.<stage>.<priority>.<tenant> (stream TOOLGATE_PIPELINE), one
// durable consumer per stage and priority. Invocation ids inside subjects are encoded with
// Token so that any CloudEvent id yields one valid subject token.
package subjects

import "strings"

// Stream names.
const (
	StreamInvoke   = "TOOLGATE_INVOKE"
	StreamPipeline = "TOOLGATE_PIPELINE"
	StreamResults  = "TOOLGATE_RESULTS"
	StreamAudit    = "AUDIT"
	// StreamInvokeSource stays empty: StreamInvoke sources it only so
	// that JetStream lets StreamInvoke keep no duplicate window (a stream
	// without sources gets one of at least 100ms, shared by all tenants).
	StreamInvokeSource = "TOOLGATE_INVOKE_SOURCE"
	// StreamAuditChain holds the signed checkpoints over AUDIT
	// (docs/audit.md), one subject, written by the audit role alone.
	StreamAuditChain = "AUDIT_CHAIN"
)

// DirectGet is the JetStream API subject of direct gets from stream: the
// audit role reads AUDIT in batches by sequence there.
func DirectGet(stream string) string { return "$JS.API.DIRECT.GET." + stream }

// MsgGet is the JetStream API subject of a get by sequence from stream,
// which the stream's leader answers (a direct get any replica may).
func MsgGet(stream string) string { return "$JS.API.STREAM.MSG.GET." + stream }

// MsgDelete is the JetStream API subject of a delete by sequence from
// stream.
func MsgDelete(stream string) string { return "$JS.API.STREAM.MSG.DELETE." + stream }

// AuditCheckpoint is the one subject of StreamAuditChain. It lies outside
// audit.> so that AUDIT never captures a checkpoint as an event.
const AuditCheckpoint = "toolgate.auditchain.checkpoint"

// Stage names, in pipeline order. A stage's durable consumer has the same name.
const (
	Validate  = "validate"
	Authorize = "authorize"
	Route     = "route"
	Execute   = "execute"
	Verify    = "verify"
	Audit     = "audit"
)

// Stages lists the stages in pipeline order.
var Stages = []string{Validate, Authorize, Route, Execute, Verify, Audit}

const (
	invokePrefix = "tool.invoke."
	resultPrefix = "tool.result."
	auditPrefix  = "audit."
	pipePrefix   = "toolgate.pipe."
)

// Invoke is the subject a tool.invoke event for tenant is published on.
func Invoke(tenant string) string { return invokePrefix + tenant }

// InvokeAll matches every tenant's invoke subject.
const InvokeAll = invokePrefix + "*"

// TenantOfInvoke returns the tenant token of an invoke subject.
func TenantOfInvoke(subject string) (string, bool) {
	t, ok := strings.CutPrefix(subject, invokePrefix)
	if !ok || t == "" || strings.Contains(t, ".") {
		return "", false
	}
	return t, true
}

// Result is the subject of the response to invocation id, made by agent
// (agent_context.agent_did; "" when the request named none):
// tool.result.<tenant>.<agent>.<id>, agent and id encoded with Token. The
// agent is in the subject so that the bus, which filters by subject only,
// lets an agent read its own agent's results and no other's.
func Result(tenant, agent, id string) string {
	return resultPrefix + tenant + "." + Token(agent) + "." + Token(id)
}

// ResultAnyAgent matches the response to invocation id of tenant, whichever
// agent made it: for readers that see the whole tenant (operators).
func ResultAnyAgent(tenant, id string) string { return resultPrefix + tenant + ".*." + Token(id) }

// ResultAgent matches every result subject of agent in tenant: what an
// agent's connection may subscribe to and read.
func ResultAgent(tenant, agent string) string {
	return resultPrefix + tenant + "." + Token(agent) + ".*"
}

// ParseResult reads the tenant, agent and invocation id of a Result subject.
func ParseResult(subject string) (tenant, agent, id string, ok bool) {
	rest, ok := strings.CutPrefix(subject, resultPrefix)
	if !ok {
		return "", "", "", false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 || parts[0] == "" {
		return "", "", "", false
	}
	agent, err := Untoken(parts[1])
	if err != nil {
		return "", "", "", false
	}
	id, err = Untoken(parts[2])
	return parts[0], agent, id, err == nil
}

// ResultTenant matches every result subject of tenant.
func ResultTenant(tenant string) string { return resultPrefix + tenant + ".*.*" }

// Cancel is the core NATS subject a cancel request is announced on, so the
// execute worker running the invocation stops it.
func Cancel(tenant, id string) string { return cancelPrefix + tenant + "." + Token(id) }

// SystemTenant is the tenant token of audit events that belong to no tenant,
// such as circuit breaker transitions: audit._system.circuit.opened.
const SystemTenant = "_system"

// ParseCancel reads the tenant and invocation id of a Cancel subject.
func ParseCancel(subject string) (tenant, id string, ok bool) {
	rest, ok := strings.CutPrefix(subject, cancelPrefix)
	if !ok {
		return "", "", false
	}
	tenant, tok, ok := strings.Cut(rest, ".")
	if !ok {
		return "", "", false
	}
	id, err := Untoken(tok)
	return tenant, id, err == nil
}

// CancelAll matches every cancel announcement.
const CancelAll = cancelPrefix + ">"

const cancelPrefix = "toolgate.cancel."

// ResultAll matches every result subject.
const ResultAll = resultPrefix + ">"

// AuditEvent is the subject of an audit event. event is the CloudEvent type without
// its "ai.agent." prefix, for example "tool.succeeded".
func AuditEvent(tenant, event string) string { return auditPrefix + tenant + "." + event }

// AuditAll matches every audit subject; AuditTenant those of one tenant.
const AuditAll = auditPrefix + ">"

// TenantOfAudit returns the tenant token of an audit event's subject.
func TenantOfAudit(subject string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, auditPrefix)
	if !ok {
		return "", false
	}
	t, _, ok := strings.Cut(rest, ".")
	return t, ok && t != ""
}

// AuditTenant matches every audit subject of tenant.
func AuditTenant(tenant string) string { return auditPrefix + tenant + ".>" }

// Priorities, highest first. An invocation without one is normal.
const (
	PriorityHigh   = "high"
	PriorityNormal = "normal"
	PriorityLow    = "low"
)

// Priorities lists the priorities, highest first.
var Priorities = []string{PriorityHigh, PriorityNormal, PriorityLow}

// Priority returns p if it is a priority, else normal.
func Priority(p string) string {
	switch p {
	case PriorityHigh, PriorityLow:
		return p
	}
	return PriorityNormal
}

// Pipe is the internal subject on which stage receives invocations of tenant
// at a priority.
func Pipe(stage, priority, tenant string) string {
	return pipePrefix + stage + "." + Priority(priority) + "." + tenant
}

// TenantOfPipe returns the tenant token of a hand-off subject.
func TenantOfPipe(subject string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, pipePrefix)
	if !ok {
		return "", false
	}
	// stage.priority.tenant, or for a hand-off to a site's execute
	// stage.priority.tenant.site; cut, not split: every hop's check asks.
	stage, rest, _ := strings.Cut(rest, ".")
	_, rest, _ = strings.Cut(rest, ".")
	tenant, site, more := strings.Cut(rest, ".")
	if more && (stage != Execute || site == "" || strings.Contains(site, ".")) || tenant == "" {
		return "", false
	}
	return tenant, true
}

// StageOfPipe returns the stage a hand-off subject is addressed to: the one
// stage that reads it.
func StageOfPipe(subject string) (string, bool) {
	if _, ok := TenantOfPipe(subject); !ok {
		return "", false
	}
	stage, _, _ := strings.Cut(strings.TrimPrefix(subject, pipePrefix), ".")
	return stage, stage != ""
}

// PipeTenant matches every hand-off subject of tenant, at any stage and
// priority.
func PipeTenant(tenant string) string { return pipePrefix + "*.*." + tenant }

// PipeStage matches every hand-off to stage, at any priority and tenant.
func PipeStage(stage string) string { return pipePrefix + stage + ".>" }

// PipeAll matches every internal hand-off subject.
const PipeAll = pipePrefix + ">"

// DirectGetKV matches every key-value read: a bucket's Get is a direct get
// of the last message on the key's subject ($KV.<bucket>.<key>), named
// after the stream. The bench counts a pipeline's key-value reads on it.
// (A wildcard is a whole token, so "KV_*" would match nothing.)
const DirectGetKV = "$JS.API.DIRECT.GET.*.$KV.>"

// Input describes where a stage consumes from.
type Input struct {
	Stream   string
	Consumer string
	Filter   string
}

// Inputs returns where stage consumes from, highest priority first:
// validate reads the ingest stream in arrival order (the priority is inside
// the event), every later stage one consumer per priority.
func Inputs(stage string) []Input {
	if stage == Validate {
		return []Input{{Stream: StreamInvoke, Consumer: Validate, Filter: InvokeAll}}
	}
	out := make([]Input, 0, len(Priorities))
	for _, p := range Priorities {
		out = append(out, Input{Stream: StreamPipeline, Consumer: stage + "-" + p, Filter: pipePrefix + stage + "." + p + ".*"})
	}
	return out
}

// InputOf returns the normal-priority input of stage.
func InputOf(stage string) Input {
	in := Inputs(stage)
	if len(in) == 1 {
		return in[0]
	}
	return in[1]
}

// Next returns the stage after stage, or "" after audit.
func Next(stage string) string {
	for i, s := range Stages {
		if s == stage && i+1 < len(Stages) {
			return Stages[i+1]
		}
	}
	return ""
}

// MaxDeliveriesAdvisory is the advisory JetStream publishes when a message of
// one of the stage's consumers reaches its delivery limit.
func MaxDeliveriesAdvisory(in Input) string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + in.Stream + "." + in.Consumer
}

// StreamDeletedAdvisory is the advisory JetStream publishes when stream is
// deleted.
func StreamDeletedAdvisory(stream string) string {
	return "$JS.EVENT.ADVISORY.STREAM.DELETED." + stream
}

// Control service endpoints (nats micro). These un-scoped subjects are for
// toolgate's own account (operators); TenantSvc gives the tenant-scoped
// subjects of the ones ControlEndpoints serves per tenant, the only ones
// agents may call.
const (
	ServiceName      = "toolgate"
	SvcStatus        = "tool.svc.status"
	SvcToolsList     = "tool.svc.tools.list"
	SvcToolsGet      = "tool.svc.tools.get"
	SvcToolsRegister = "tool.svc.tools.register"
	// SvcApproval takes {"tenant_id","invocation_id","approve","decided_by","reason"}.
	SvcApproval = "tool.svc.approval"
	// SvcCancel takes {"tenant_id","invocation_id","reason"}.
	SvcCancel = "tool.svc.cancel"
	// SvcToolsDelete takes {"tool_id","version"} and marks that version
	// removed; SvcToolsPurge takes the same and deletes it for good.
	SvcToolsDelete = "tool.svc.tools.delete"
	SvcToolsPurge  = "tool.svc.tools.purge"
	// SvcApprovalsList takes {"tenant_id"} and lists its pending approvals;
	// SvcApprovalsGet takes {"tenant_id","invocation_id"}.
	SvcApprovalsList = "tool.svc.approvals.list"
	SvcApprovalsGet  = "tool.svc.approvals.get"
	// SvcBudget takes {"tenant_id","session","limits"}.
	SvcBudget = "tool.svc.budget"
	// SvcToolsStats takes {"tool_id"} (optional) and answers usage statistics.
	SvcToolsStats = "tool.svc.tools.stats"
	// SvcModelsStats takes {"model","task_type","by_model"} (all optional)
	// and answers the cluster-wide model statistics. Operators only.
	SvcModelsStats = "tool.svc.models.stats"
	// SvcCapabilityRequest takes a capability request and
	// answers the matched tools and, when policy grants one, a child token.
	// Tenant-scoped only.
	SvcCapabilityRequest = "tool.svc.capability.request"
	// SvcCapabilityReport takes {"request_id"} (and "tenant_id" un-scoped)
	// and answers the request's run report.
	SvcCapabilityReport = "tool.svc.capability.report"
	// SvcAuditHistory takes api.AuditHistoryRequest and answers a page of
	// the tenant's stored audit events (api.AuditHistoryResponse).
	// Tenant-scoped only: the tenant is the subject's.
	SvcAuditHistory = "tool.svc.audit.history"
	// SvcCheckpointsList, SvcCheckpointsGet and SvcCheckpointsDelete take
	// api.CheckpointsRequest and list, show (with the state when asked)
	// or delete the tenant's checkpoints. Tenant-scoped only.
	SvcCheckpointsList   = "tool.svc.checkpoints.list"
	SvcCheckpointsGet    = "tool.svc.checkpoints.get"
	SvcCheckpointsDelete = "tool.svc.checkpoints.delete"
	// SvcReceipt takes api.ReceiptRequest and answers the invocation's
	// signed receipt and its inclusion proof (api.ReceiptResponse).
	SvcReceipt = "tool.svc.receipt"
)

// Administrative control endpoints (control API 1.3): the one surface for
// operators' changes to policy, hooks, revocations, breakers and the model
// catalogue. Operators only (account TOOLGATE, requests signed with
// operator credentials); never tenant-scoped. Each takes and answers the
// api types named.
const (
	// SvcPolicyPush takes api.PolicyPushRequest; SvcPolicyGet answers
	// api.PolicyBundle; SvcPolicyReset takes {} and removes the pushed
	// policy, so workers return to their configured one.
	SvcPolicyPush  = "tool.svc.policy.push"
	SvcPolicyGet   = "tool.svc.policy.get"
	SvcPolicyReset = "tool.svc.policy.reset"
	// SvcHooksPush takes api.HooksPushRequest, SvcHooksList api.HooksRequest
	// (tenant optional), SvcHooksDelete api.HooksRequest.
	SvcHooksPush   = "tool.svc.hooks.push"
	SvcHooksList   = "tool.svc.hooks.list"
	SvcHooksDelete = "tool.svc.hooks.delete"
	// SvcTokensRevoke takes api.RevokeRequest.
	SvcTokensRevoke = "tool.svc.tokens.revoke"
	// SvcTokensKeys takes {} and answers the public key set (JWKS) the
	// deployment verifies capability tokens with, as it is now: what a
	// front end connected as an agent verifies other tokens with.
	SvcTokensKeys = "tool.svc.tokens.keys"
	// SvcBreakersList takes {}; SvcBreakersSet takes api.BreakerSetRequest.
	SvcBreakersList = "tool.svc.breakers.list"
	SvcBreakersSet  = "tool.svc.breakers.set"
	// SvcModelsRegister takes api.ModelRequest, SvcModelsList {},
	// SvcModelsDelete api.ModelRequest (name), SvcModelsPolicy
	// api.RoutingPolicyRequest.
	SvcModelsRegister = "tool.svc.models.register"
	SvcModelsList     = "tool.svc.models.list"
	SvcModelsDelete   = "tool.svc.models.delete"
	SvcModelsPolicy   = "tool.svc.models.policy"
	// SvcBudgetsList takes api.BudgetsRequest and answers
	// api.BudgetsResponse: the sessions nearest their caps.
	SvcBudgetsList = "tool.svc.budgets.list"
)

// ControlEndpoint is one endpoint of the control service and who may
// call it.
type ControlEndpoint struct {
	Subject string
	// Operator: served on Subject in toolgate's own account, for
	// operators and toolgate's own processes.
	Operator bool
	// Tenant: served per tenant on TenantSvc(tenant, Subject). These are
	// the only endpoints an agent may call (its own tenant's) and exactly
	// what a tenant's account imports (busauth).
	Tenant bool
	// Admin: an administrative endpoint, served on Subject: operators
	// only, every request signed with operator credentials.
	Admin bool
}

// ControlEndpoints are the control service's endpoints: the one table
// the service serves from and the bus permissions are derived from.
var ControlEndpoints = []ControlEndpoint{
	{Subject: SvcStatus, Operator: true, Tenant: true},
	{Subject: SvcCancel, Operator: true, Tenant: true},
	{Subject: SvcReceipt, Operator: true, Tenant: true},
	{Subject: SvcToolsList, Operator: true, Tenant: true},
	{Subject: SvcToolsGet, Operator: true, Tenant: true},
	{Subject: SvcBudget, Operator: true, Tenant: true},
	{Subject: SvcApprovalsList, Operator: true, Tenant: true},
	{Subject: SvcApprovalsGet, Operator: true, Tenant: true},
	{Subject: SvcCapabilityRequest, Tenant: true},
	{Subject: SvcCapabilityReport, Operator: true, Tenant: true},
	{Subject: SvcAuditHistory, Tenant: true},
	{Subject: SvcCheckpointsList, Tenant: true},
	{Subject: SvcCheckpointsGet, Tenant: true},
	{Subject: SvcCheckpointsDelete, Tenant: true},
	{Subject: SvcTokensKeys, Operator: true, Tenant: true},
	{Subject: SvcToolsRegister, Operator: true},
	{Subject: SvcToolsDelete, Operator: true},
	{Subject: SvcToolsPurge, Operator: true},
	{Subject: SvcToolsStats, Operator: true},
	{Subject: SvcModelsStats, Operator: true},
	{Subject: SvcApproval, Operator: true},
	{Subject: SvcPolicyPush, Admin: true},
	{Subject: SvcPolicyGet, Admin: true},
	{Subject: SvcPolicyReset, Admin: true},
	{Subject: SvcHooksPush, Admin: true},
	{Subject: SvcHooksList, Admin: true},
	{Subject: SvcHooksDelete, Admin: true},
	{Subject: SvcTokensRevoke, Admin: true},
	{Subject: SvcBreakersList, Admin: true},
	{Subject: SvcBreakersSet, Admin: true},
	{Subject: SvcModelsRegister, Admin: true},
	{Subject: SvcModelsList, Admin: true},
	{Subject: SvcModelsDelete, Admin: true},
	{Subject: SvcModelsPolicy, Admin: true},
	{Subject: SvcBudgetsList, Admin: true},
	{Subject: SvcDocsSourceAdd, Admin: true},
	{Subject: SvcDocsSourceList, Admin: true},
	{Subject: SvcDocsSourceRemove, Admin: true},
	{Subject: SvcSitesAdd, Admin: true},
	{Subject: SvcSitesRemove, Admin: true},
	{Subject: SvcRedriveList, Admin: true},
	{Subject: SvcRedriveShow, Admin: true},
	{Subject: SvcRedriveRun, Admin: true},
	{Subject: SvcPolicyShadowPush, Admin: true},
	{Subject: SvcPolicyShadowGet, Admin: true},
	{Subject: SvcPolicyShadowDrop, Admin: true},
	{Subject: SvcPolicyShadowPromote, Admin: true},
	{Subject: SvcPolicyShadowReport, Admin: true},
}

// TenantServices are the endpoints of ControlEndpoints served per tenant,
// in its order.
var TenantServices = controlEndpoints(func(e ControlEndpoint) bool { return e.Tenant })

// AdminServices are the administrative endpoints of ControlEndpoints, in
// its order.
var AdminServices = controlEndpoints(func(e ControlEndpoint) bool { return e.Admin })

func controlEndpoints(keep func(ControlEndpoint) bool) []string {
	var out []string
	for _, e := range ControlEndpoints {
		if keep(e) {
			out = append(out, e.Subject)
		}
	}
	return out
}

// TenantSvc is the tenant-scoped subject of control endpoint svc (one of the
// Svc constants): tool.svc.status for tenant demo is tool.svc.demo.status.
// The bus lets an agent call only its own tenant's endpoints.
func TenantSvc(tenant, svc string) string {
	return "tool.svc." + tenant + "." + strings.TrimPrefix(svc, "tool.svc.")
}
