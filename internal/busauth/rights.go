package busauth

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// RoleRights are what one role of account TOOLGATE needs, by kind of work.
// The permissions a connection gets (GrantFor) are computed from them and
// from nothing else, and so is the role table of docs/security.md
// (RoleTable), so the two cannot drift apart.
//
// No role but the operator may create, update or delete a stream or a
// consumer: JetStream checks neither a stream's republish destination nor a
// push consumer's deliver subject against the rights of whoever creates it,
// so that right would be the right to publish anywhere in the account. The
// topology is the operator's (serve at start with operator credentials, or
// `toolgate setup`); every other role binds to it.
type RoleRights struct {
	// Consumes are the stage's durable consumers: their information,
	// pulls, acks and delivery-limit advisories.
	Consumes []subjects.Input
	// Sweeps are the work-queue streams whose acknowledged leftovers the
	// role may read and delete (the stage's own input stream).
	Sweeps []string
	// Ends are the streams the role deletes a call's message from once
	// it ended the call, and reads nothing of: the invoke stream, when it
	// keeps each invocation until its ending (topology.MemoryHops).
	Ends []string
	// Publishes are the subjects the role may publish on: its hand-offs,
	// and for audit the audit events and results.
	Publishes []string
	// Emits are the audit events and results the role sends audit to
	// publish: it may publish them on the relay only (subjects.Relay),
	// and audit publishes only those of a sender whose role emits them,
	// with the type and source they carry there (MayEmit).
	Emits []Emission
	// Subscribes are the core subjects the role listens on besides its
	// inbox and its watches.
	Subscribes []string
	// Reads are the buckets the role reads (lookups and key listings);
	// Writes those it writes (and so reads); Watches those whose changes
	// it follows (republished by JetStream: subjects.KVFeed).
	Reads, Writes, Watches []string
	// Streams are other streams the role reads messages of by sequence;
	// Direct those it reads in batches by sequence (direct gets).
	Streams, Direct []string
	// Counts are streams whose per-subject message counts the role reads
	// (stream information), never a message of them.
	Counts []string
	// Observes are streams whose consumers' state the role reads
	// (consumer information: counts and times), never a message.
	Observes []string
	// Objects are the object store buckets the role puts objects in and
	// reads them back from (by direct gets: no consumer). The bucket's
	// stream refuses deletes; purges are the operator's (archivestore).
	Objects []string
	// Serves says the role serves the control service's endpoints.
	Serves bool
	// Outbox, when set, is the only subject (pattern) the role publishes
	// on: what it publishes and emits (Publishes, Emits, for which it signs)
	// goes there, and the hub forwards it (a site's: subjects.SiteOutbox).
	Outbox string
}

// Buckets are every bucket the role opens.
func (r RoleRights) Buckets() []string {
	var out []string
	for _, b := range slices.Concat(r.Reads, r.Writes, r.Watches) {
		if !slices.Contains(out, b) {
			out = append(out, b)
		}
	}
	return out
}

// Emission is one kind of audit event (or result) a role emits: the
// subjects it goes on (a pattern), the CloudEvent types it may carry there
// (patterns of dot-separated tokens, as subjects) and the sources it may
// name. Only these, together, are what the role's key vouches for on the
// relay: a key that may emit tool.invoked does not vouch for an approval
// sent on tool.invoked's subject.
type Emission struct {
	Subject string
	Types   []string
	Sources []string
}

// source is the CloudEvent source of what role's own code emits.
func source(role Role) string { return "urn:toolgate:" + string(role) }

// emits is the Emission of the one type typ on subject, from role.
func emits(role Role, subject string, types ...string) Emission {
	return Emission{Subject: subject, Types: types, Sources: []string{source(role)}}
}

// poison is what every stage's runner publishes itself: the audit event of
// a message it cannot read, which no later stage could.
func poison(stage Role) Emission {
	return emits(stage, subjects.AuditEvent("*", "pipeline.poison"), api.TypePoison)
}

// stateRefused is the audit event of signed state a reader ignored
// (internal/signedstate).
func stateRefused(role Role) Emission {
	return emits(role, subjects.AuditEvent(subjects.SystemTenant, "state.refused"), api.TypeStateRefused)
}

// approvals are the events of approvals: authorize's requests and expiries,
// and the decisions control applies, which it writes as authorize's (the
// decision resumes or ends authorize's parked call).
var approvals = subjects.AuditEvent("*", "tool.approval.>")

// hand is the hand-off to stage, at any priority and tenant.
func hand(stage string) string { return subjects.PipeStage(stage) }

// Rights are the rights of each role but the agent's and the operator's.
var Rights = map[Role]RoleRights{
	// validate reads raw invocations and their tokens, claims each id in its
	// tenant, and hands on to authorize, or ends a refusal in audit; an
	// async call's first answer (pending) is its own to publish.
	RoleValidate: {
		Consumes:  subjects.Inputs(subjects.Validate),
		Sweeps:    []string{subjects.StreamInvoke},
		Publishes: []string{hand(subjects.Authorize), hand(subjects.Audit)},
		Emits: []Emission{poison(RoleValidate), emits(RoleValidate, subjects.ResultAll, api.TypeAccepted),
			stateRefused(RoleValidate)},
		Writes:  []string{subjects.BucketInvocations},
		Watches: []string{subjects.BucketTools},
		// Its sweep tells a leftover from a stuck call by the newer
		// messages of the call in the pipeline.
		Streams: []string{subjects.StreamPipeline},
	},
	// authorize verifies tokens, judges policy, parks calls for approval
	// and charges budgets; it strips the raw token from what it hands on.
	RoleAuthorize: {
		Consumes:  subjects.Inputs(subjects.Authorize),
		Sweeps:    []string{subjects.StreamPipeline},
		Publishes: []string{hand(subjects.Route), hand(subjects.Audit)},
		Emits: []Emission{poison(RoleAuthorize), emits(RoleAuthorize, approvals, "ai.agent.tool.approval.>"),
			stateRefused(RoleAuthorize), emits(RoleAuthorize, subjects.ShadowDivergedAll, api.TypeShadowDiverged),
			emits(RoleAuthorize, subjects.DecisionRecordedAll, api.TypeDecisionRecorded)},
		Writes:  []string{subjects.BucketInvocations, subjects.BucketApprovals, subjects.BucketBudgets, subjects.BucketSettings},
		Watches: []string{subjects.BucketTools, subjects.BucketPolicies, subjects.BucketRevocations, subjects.BucketInvocations},
	},
	// route resolves versions and takes rate-limit tokens.
	RoleRoute: {
		Consumes:  subjects.Inputs(subjects.Route),
		Sweeps:    []string{subjects.StreamPipeline},
		Publishes: []string{hand(subjects.Execute), hand(subjects.Audit)},
		Emits:     []Emission{poison(RoleRoute), stateRefused(RoleRoute)},
		Writes:    []string{subjects.BucketRateLimits},
		Reads:     []string{subjects.BucketInvocations}, // its sweep reads a leftover's record
		Watches:   []string{subjects.BucketTools},
	},
	// execute runs tools: the only role that touches breakers and
	// checkpoints; it announces a call's start, its checkpoints and its
	// breakers' transitions itself, as they happen.
	RoleExecute: {
		Consumes: subjects.Inputs(subjects.Execute),
		Sweeps:   []string{subjects.StreamPipeline},
		// It sweeps the sites' consumers too, whose workers may not.
		Observes:  []string{subjects.StreamPipeline},
		Publishes: []string{hand(subjects.Verify), hand(subjects.Audit)},
		Emits: []Emission{poison(RoleExecute), emits(RoleExecute, subjects.AuditEvent("*", "tool.invoked"), api.TypeInvoked),
			emits(RoleExecute, subjects.AuditEvent("*", "tool.checkpoint.>"), api.TypeCheckpointCreated),
			{Subject: subjects.AuditEvent(subjects.SystemTenant, "circuit.>"), Sources: []string{"urn:toolgate:breaker"},
				Types: []string{api.TypeCircuitOpened, api.TypeCircuitHalfOpened, api.TypeCircuitClosed}},
			stateRefused(RoleExecute)},
		Subscribes: []string{subjects.CancelAll, subjects.DocsUpdatedAll, sitesAdvisories},
		Writes: []string{subjects.BucketInvocations, subjects.BucketIdempotency, subjects.BucketCheckpoints,
			subjects.BucketBreakers, subjects.BucketModelStats, subjects.BucketSettings, subjects.BucketDocCache,
			subjects.BucketAgentRuns},
		Watches: []string{subjects.BucketTools, subjects.BucketBreakers, subjects.BucketModels, subjects.BucketModelStats,
			subjects.BucketDocSources, subjects.BucketPolicies},
	},
	// verify checks results against the tool's output schema and the
	// detectors.
	RoleVerify: {
		Consumes:  subjects.Inputs(subjects.Verify),
		Sweeps:    []string{subjects.StreamPipeline},
		Publishes: []string{hand(subjects.Audit)},
		Emits:     []Emission{poison(RoleVerify), stateRefused(RoleVerify)},
		Reads:     []string{subjects.BucketInvocations}, // its sweep reads a leftover's record
		Watches:   []string{subjects.BucketTools},
	},
	// audit is the one finaliser: the audit trail, results, terminal
	// status, usage, and the calls hooks start. It alone publishes audit
	// events and results, its own and those the others emit on the relay
	// once it has checked who sent them. It alone signs the
	// checkpoints over AUDIT, reading the events in batches (and, for a
	// sequence a batch lacked, from the leader) and the chain's last
	// checkpoint.
	RoleAudit: {
		Consumes:  append(subjects.Inputs(subjects.Audit), subjects.RelayInput, subjects.AuditOTLPInput),
		Sweeps:    []string{subjects.StreamPipeline},
		Ends:      []string{subjects.StreamInvoke},
		Publishes: []string{subjects.AuditAll, subjects.ResultAll, subjects.InvokeAll, subjects.AuditCheckpoint, subjects.DeadLetterAll},
		Writes:    []string{subjects.BucketInvocations, subjects.BucketBudgets, subjects.BucketToolStats},
		Watches:   []string{subjects.BucketTools, subjects.BucketHooks},
		Streams:   []string{subjects.StreamAuditChain, subjects.StreamAudit},
		// After a restart that lost the hops in memory it looks for the
		// result of an ending recorded before it (by subject, the
		// results it publishes).
		Direct: []string{subjects.StreamAudit, subjects.StreamResults},
		// The audit archive's default bucket (docs/audit.md).
		Objects: []string{subjects.BucketAuditArchive},
	},
	// control serves the control endpoints: it registers tools, records
	// decisions and cancels, and for operators' signed requests writes
	// policies, hooks, revocations, forced breakers and models. A decided
	// call goes back to authorize, a cancelled one to audit.
	RoleControl: {
		Publishes: []string{hand(subjects.Authorize), hand(subjects.Audit), subjects.CancelAll, subjects.InvokeAll},
		Emits: []Emission{emits(RoleControl, subjects.AuditEvent("*", "capability.>"), "ai.agent.capability.>"),
			{Subject: approvals, Sources: []string{source(RoleAuthorize)},
				Types: []string{api.TypeApprovalGranted, api.TypeApprovalDenied, api.TypeApprovalExpired}},
			emits(RoleControl, subjects.AuditTenant(subjects.SystemTenant), "ai.agent.admin.>", api.TypeStateRefused, api.TypeViewRefused),
			// The bus's refusals, which the control connection records.
			{Subject: subjects.AuditTenant(subjects.SystemTenant), Types: []string{api.TypeBusRefused},
				Sources: []string{"urn:toolgate:busauth"}},
			// What an operator's connection, which may not publish audit
			// events, records through control's when no audit stage runs
			// beside it: a recreated AUDIT, and the state its readers
			// (each under its stage's source) ignored.
			{Subject: subjects.AuditTenant(subjects.SystemTenant), Types: []string{api.TypeAuditRecreated},
				Sources: []string{"urn:toolgate:node"}},
			{Subject: subjects.AuditTenant(subjects.SystemTenant), Types: []string{api.TypeStateRefused},
				Sources: []string{source(RoleAuthorize), source(RoleRoute), source(RoleExecute), source(RoleAudit), source(RoleOperator)}}},
		Writes: []string{subjects.BucketTools, subjects.BucketApprovals, subjects.BucketInvocations, subjects.BucketCapabilities,
			subjects.BucketPolicies, subjects.BucketHooks, subjects.BucketRevocations, subjects.BucketBreakers, subjects.BucketModels,
			subjects.BucketDocSources, subjects.BucketCheckpoints},
		Reads:   []string{subjects.BucketBudgets, subjects.BucketToolStats, subjects.BucketModelStats},
		Watches: []string{subjects.BucketTools, subjects.BucketRevocations, subjects.BucketPolicies},
		// It reads the audit trail by sequence for the tenant-scoped
		// history agents page through (they may create no consumer).
		// It reads the dead letters operators re-drive, and starts each
		// re-drive as a new invocation (docs/redrive.md).
		// It reads the chain's checkpoints and the events they cover to
		// prove a receipt (docs/audit.md#receipts).
		Streams: []string{subjects.StreamPipeline, subjects.StreamAudit, subjects.StreamDeadLetter, subjects.StreamAuditChain},
		// A cancel of a call validate has not claimed yet is taken when
		// the tenant has calls waiting there: counts, not the raw
		// invocations with their tokens.
		Counts: []string{subjects.StreamInvoke},
		// A call's status names the link of the site it waits for, which
		// the site's consumers tell.
		Observes: []string{subjects.StreamPipeline},
		Serves:   true,
	},
}

// permissions turns rights into subject permissions.
func (r RoleRights) permissions(role Role) jwt.Permissions {
	return r.permissionsWithInbox(RoleInbox(role))
}

// permissionsWithInbox turns rights into subject permissions with replies
// below inbox.
func (r RoleRights) permissionsWithInbox(inbox string) jwt.Permissions {
	var p jwt.Permissions
	add := func(perm *jwt.Permission, subs ...string) {
		for _, s := range subs {
			if !slices.Contains(perm.Allow, s) {
				perm.Allow.Add(s)
			}
		}
	}
	add(&p.Sub, inbox+".>")
	add(&p.Pub, "$JS.API.INFO")
	if r.Outbox != "" {
		// It signs what it publishes and emits for those subjects, and
		// sends it on its outbox only.
		add(&p.Pub, r.Outbox)
	} else {
		add(&p.Pub, r.Publishes...)
		for _, e := range r.Emits {
			add(&p.Pub, subjects.Relay(e.Subject))
		}
	}
	add(&p.Sub, r.Subscribes...)
	for _, in := range r.Consumes {
		add(&p.Pub,
			"$JS.API.STREAM.INFO."+in.Stream,
			"$JS.API.CONSUMER.INFO."+in.Stream+"."+in.Consumer,
			"$JS.API.CONSUMER.MSG.NEXT."+in.Stream+"."+in.Consumer,
			"$JS.ACK."+in.Stream+"."+in.Consumer+".>",
		)
		add(&p.Sub, subjects.MaxDeliveriesAdvisory(in))
	}
	for _, st := range r.Sweeps {
		add(&p.Pub, "$JS.API.STREAM.MSG.GET."+st, "$JS.API.STREAM.MSG.DELETE."+st)
	}
	for _, st := range r.Ends {
		add(&p.Pub, subjects.MsgDelete(st))
	}
	for _, st := range r.Streams {
		// The client asks a stream that allows direct gets with one
		// (jetstream.Stream.GetMsg), others with a get by sequence.
		add(&p.Pub, "$JS.API.STREAM.INFO."+st, "$JS.API.STREAM.MSG.GET."+st, subjects.DirectGet(st))
	}
	for _, st := range r.Direct {
		add(&p.Pub, "$JS.API.STREAM.INFO."+st, subjects.DirectGet(st))
	}
	for _, st := range r.Counts {
		add(&p.Pub, "$JS.API.STREAM.INFO."+st)
	}
	for _, st := range r.Observes {
		add(&p.Pub, "$JS.API.CONSUMER.INFO."+st+".*")
	}
	for _, b := range r.Objects {
		st := subjects.ObjectStream(b)
		add(&p.Pub, subjects.ObjectAll(b), "$JS.API.STREAM.INFO."+st, subjects.DirectGet(st), subjects.DirectGet(st)+".>",
			"$JS.API.STREAM.MSG.GET."+st)
	}
	for _, b := range r.Buckets() {
		st := subjects.BucketStream(b)
		add(&p.Pub, "$JS.API.STREAM.INFO."+st, "$JS.API.DIRECT.GET."+st+".>", "$JS.API.STREAM.MSG.GET."+st)
	}
	for _, b := range r.Writes {
		add(&p.Pub, subjects.BucketKeys(b))
	}
	for _, b := range r.Watches {
		if pattern, ok := subjects.WatchedKeys(b); ok {
			add(&p.Sub, subjects.KVFeed(b)+pattern)
		}
	}
	if r.Serves {
		add(&p.Sub, "tool.svc.>", "$SRV.>")
		add(&p.Pub, "$SRV.>")
	}
	// Replies to requests the role serves (control) or receives.
	p.Resp = &jwt.ResponsePermission{MaxMsgs: 1, Expires: time.Minute}
	return p
}

// codeList renders ss as a table cell: each in backticks, "—" for none.
func codeList(ss []string) string {
	if len(ss) == 0 {
		return "—"
	}
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = "`" + s + "`"
	}
	return strings.Join(out, ", ")
}

// RoleTable renders Rights as the Markdown table of docs/security.md
// (a test holds the page to it).
func RoleTable() string {
	var b strings.Builder
	b.WriteString("| role | pulls from (durable consumers) | publishes | writes buckets | watches buckets | also reads |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	type roleRow struct {
		name string
		r    RoleRights
	}
	var rows []roleRow
	for _, role := range append(slices.Clone(StageRoles), RoleControl) {
		rows = append(rows, roleRow{string(role), Rights[role]})
	}
	// A site's row, for a site called NAME (docs/sites.md).
	rows = append(rows, roleRow{string(RoleSite) + " (NAME)", SiteRights("NAME")})
	for _, row := range rows {
		r := row.r
		var consumers []string
		for _, in := range r.Consumes {
			consumers = append(consumers, in.Stream+"/"+in.Consumer)
		}
		if r.Serves {
			consumers = append(consumers, "serves tool.svc.>")
		}
		pubs := slices.Clone(r.Publishes)
		for _, e := range r.Emits {
			if relay := subjects.Relay(e.Subject); !slices.Contains(pubs, relay) {
				pubs = append(pubs, relay)
			}
		}
		if r.Outbox != "" {
			pubs = append(pubs, "all through "+r.Outbox)
		}
		if len(r.Subscribes) > 0 {
			pubs = append(pubs, "hears "+strings.Join(r.Subscribes, ", "))
		}
		reads := slices.Concat(r.Reads, r.Streams)
		for _, st := range r.Direct {
			reads = append(reads, st+" (direct gets)")
		}
		for _, st := range r.Sweeps {
			reads = append(reads, st+" (sweeps its leftovers)")
		}
		for _, st := range r.Counts {
			reads = append(reads, st+" (message counts only)")
		}
		for _, st := range r.Ends {
			reads = append(reads, st+" (deletes an ended call's, reads none)")
		}
		for _, st := range r.Observes {
			reads = append(reads, st+" (its consumers' state only)")
		}
		writes := slices.Clone(r.Writes)
		for _, o := range r.Objects {
			writes = append(writes, o+" (objects, no deletes)")
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", row.name, codeList(consumers), codeList(pubs), codeList(writes), codeList(r.Watches), codeList(reads))
	}
	return b.String()
}
