// Package control serves toolgate's request-reply control API as a NATS
// micro service, so `nats micro ls` and `nats micro info toolgate` find it:
// invocation status, tool listing and lookup, and tool registration.
package control

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/toolgate/toolgate/internal/signedstate"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/internal/tooldesc"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// Version is the control API version. 1.1: tenant-scoped endpoints
// tool.svc.<tenant>.status|cancel|tools.list|tools.get, the ones agents may
// call; the un-scoped ones are for toolgate's own account (operators). 1.2:
// tools.list searches, filters and pages; tools.stats; tenant-scoped
// capability.request and capability.report, budget, approvals.list and
// approvals.get, which agents may call for their own tenant. 1.3: the
// operators' administrative endpoints policy.push|get, hooks.push|list|
// delete, tokens.revoke, breakers.list|set and models.register|list|delete|
// policy, signed with operator credentials and audited; tools.register
// and tools.delete audited too; the capability grant rule follows policy
// pushes; models.stats. 1.4: tenant-scoped audit.history, a tenant's
// stored audit events a page at a time, which agents may call. 1.5:
// budgets.list, the sessions nearest their caps, for operators;
// tenant-scoped checkpoints.list|get|delete. 1.6: an agent sees only its
// own calls on the tenant-scoped endpoints (E3260 for another agent's),
// unless its token is a tenant reader's; results are published on
// tool.result.<tenant>.<agent>.<id>. 1.7: tokens.keys, operators' and
// tenant-scoped, the public key set tokens are verified with;
// policy.reset, which removes the pushed policy. 1.8: tools.register
// refuses texts aimed at the agent (E3865, E3866), holds the change of an
// imported tool whose server lists it otherwise (E3869), which operators'
// tools.get shows, and stores it on a register naming its accept_digest.
const Version = "1.8.0"

// Start adds the service to nc. Stop it with the returned service's Stop.
// approvals may be nil: the approval endpoint then is not served.
func Start(nc *nats.Conn, store *kvstore.Store, reg *tools.Registry, approvals *approval.Service, opts ...Option) (micro.Service, error) {
	svc, err := micro.AddService(nc, micro.Config{
		Name: subjects.ServiceName, Version: Version,
		Description: "toolgate control: invocation status, the tool registry and administration",
	})
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	h := &handlers{nc: nc, js: js, store: store, admin: store, reg: reg, approvals: approvals,
		publish: func(ctx context.Context, o stages.Output) error { return runner.Publish(ctx, js, o) }}
	for _, o := range opts {
		o(h)
	}
	// The capability grant rule follows policy pushes, as authorize's
	// policy does.
	watchCtx, stopWatch := context.WithCancel(context.Background())
	if h.disc.Grants != nil {
		if err := h.watchGrants(watchCtx); err != nil {
			stopWatch()
			_ = svc.Stop()
			return nil, err
		}
	}
	eps, err := h.serving(approvals != nil)
	if err != nil {
		stopWatch()
		_ = svc.Stop()
		return nil, err
	}
	for _, ep := range eps {
		if err := svc.AddEndpoint(ep.name, ep.fn, micro.WithEndpointSubject(ep.subject)); err != nil {
			stopWatch()
			_ = svc.Stop()
			return nil, err
		}
	}
	// The endpoints answer once the server has their subscriptions: a
	// request sent right after Start must not meet "no responders".
	if err := nc.Flush(); err != nil {
		stopWatch()
		_ = svc.Stop()
		return nil, err
	}
	return service{svc, stopWatch}, nil
}

// service is the micro service whose Stop also ends the policy watch.
type service struct {
	micro.Service
	stopWatch context.CancelFunc
}

func (s service) Stop() error {
	s.stopWatch()
	return s.Service.Stop()
}

// store is what the control service reads and writes (*kvstore.Store).
type store interface {
	Status(ctx context.Context, tenant, id string) (api.Record, error)
	UpdateRecord(ctx context.Context, tenant, id string, change func(*api.Record)) (api.Record, error)
	RegisterSignedTool(ctx context.Context, doc []byte, replace bool, by string, proof *api.DecisionProof) (*tools.Manifest, error)
	RemoveTool(ctx context.Context, id, version string, r kvstore.ToolRemoval) (*tools.Manifest, error)
	PurgeTool(ctx context.Context, id, version string) error
	PendingApprovals(ctx context.Context) ([]api.Approval, error)
	Approval(ctx context.Context, tenant, id string) (api.Approval, error)
	Usage(ctx context.Context, tenant, session string) (kvstore.Usage, error)
	ToolStats(ctx context.Context) (map[string]kvstore.ToolShard, error)
	ModelStats(ctx context.Context) (map[kvstore.ModelTask]kvstore.ModelShard, error)
	ModelStatsTTL() time.Duration
	SaveCapability(ctx context.Context, r api.CapabilityReport) error
	Capability(ctx context.Context, tenant, id string) (api.CapabilityReport, error)
	Tool(ctx context.Context, id, version string) (kvstore.ToolRecord, error)
	HoldToolChange(ctx context.Context, id, version string, p kvstore.ToolPending) error
	checkpointStore
}

var _ store = (*kvstore.Store)(nil)

// Option configures the service.
type Option func(*handlers)

// Identify names who sent a request from its subject, headers and body
// (a signed request, busauth.RequestVerifier), or refuses it.
type Identify func(subject string, h nats.Header, body []byte) (string, error)

// WithDeciders makes the approval endpoint record the identity id returns
// as the decider, never the body's decided_by, and refuse requests id
// refuses (E3217); the administrative endpoints likewise record it as who
// made a change and refuse what id refuses (E3219). Without it (a bus
// without authentication) the body's decided_by or by is recorded.
func WithDeciders(id Identify) Option { return func(h *handlers) { h.identify = id } }

// WithManifestCheck has the service refuse a manifest check refuses
// before storing it: the tool kinds' own checks (kind.Registry.Check).
func WithManifestCheck(check func(*tools.Manifest) error) Option {
	return func(h *handlers) { h.checkManifest = check }
}

// WithStateProof makes the service honour a pushed policy (for its
// capability grants) only when an operator's signature covers it
// (internal/signedstate); one that fails is ignored and audited.
func WithStateProof(v signedstate.Verify) Option { return func(h *handlers) { h.stateProof = v } }

// WithDeadLetterCheck has the service read a dead letter only when check
// finds the audit stage's signature on it (seal.Messages.Sender).
func WithDeadLetterCheck(check func(subject string, h nats.Header, data []byte) error) Option {
	return func(h *handlers) { h.deadLetterSigned = check }
}

// WithSigner signs the cancel announcements the service sends on core
// NATS (seal.Signer.Sign), as its JetStream publishes are signed: execute
// stops a call only for a cancel control signed.
func WithSigner(sign func(subject string, h nats.Header, data []byte) nats.Header) Option {
	return func(h *handlers) { h.sign = sign }
}

// WithCancelSigner signs each cancel request the service records on an
// invocation's status (seal.Signer.SignCancel): execute honours the flag
// only with control's signature, since every stage may write that bucket.
func WithCancelSigner(sign func(tenant, id, by string) string) Option {
	return func(h *handlers) { h.signCancel = sign }
}

// WithJetStream has the service publish through js, such as a
// seal.SigningJetStream that signs what it sends, instead of a JetStream
// of its own on the connection.
func WithJetStream(js jetstream.JetStream) Option {
	return func(h *handlers) {
		h.js = js
		h.publish = func(ctx context.Context, o stages.Output) error { return runner.Publish(ctx, js, o) }
	}
}

// WithSites has the status of a call of a site's tool, while it has not
// ended, name the site and its link (site: the site's state at the hub).
func WithSites(site func(ctx context.Context, name string) (api.SiteWait, error)) Option {
	return func(h *handlers) { h.site = site }
}

type handlers struct {
	identify Identify
	// site, when set, reads a site's state (WithSites).
	site func(ctx context.Context, name string) (api.SiteWait, error)
	// siteAdmin, when set, declares and removes sites (WithSiteAdmin).
	siteAdmin SiteAdmin
	// checkManifest, when set, refuses manifests beyond their schema.
	checkManifest func(*tools.Manifest) error
	stateProof    signedstate.Verify
	// deadLetterSigned, when set, checks a dead letter's signer.
	deadLetterSigned func(subject string, h nats.Header, data []byte) error
	sign             func(subject string, h nats.Header, data []byte) nats.Header
	signCancel       func(tenant, id, by string) string
	nc               *nats.Conn
	js               jetstream.JetStream
	store            store
	admin            adminStore
	// publish appends an audit event (runner.Publish on js).
	publish   func(context.Context, stages.Output) error
	reg       *tools.Registry
	approvals *approval.Service

	disc       Discovery
	statsCache statsCache

	// grants is the capability grant rule in force (watchGrants);
	// policyRev the last policy revision it has seen.
	grants        atomic.Pointer[policy.Grants]
	policyRev     atomic.Uint64
	grantsWatched bool

	// chainKey checks the checkpoints a receipt is proven under.
	chainKey ed25519.PublicKey
}

// cancel records a cancel request and announces it. A queued invocation ends
// cancelled when it reaches execute, a running one when its worker hears the
// announcement, a parked one at once. The reply is the invocation's record;
// an invocation that already ended keeps its status.
//
// Only a known invocation can be cancelled: one with a record, or one still
// on the invoke or pipeline stream (accepted by JetStream, no stage has
// written its record yet). Any other id is answered with
// invocation_not_found (E3025) and nothing is written, so a cancel can never
// lie in wait for a later invocation that reuses the id.
func (h *handlers) cancel() request[api.CancelRequest] {
	return request[api.CancelRequest]{
		expected: `{"tenant_id":…, "invocation_id":…, "reason":…}`, scopedExpected: `{"invocation_id":…, "reason":…}`,
		tenant:   func(r *api.CancelRequest) *string { return &r.TenantID },
		complete: func(r *api.CancelRequest) bool { return r.InvocationID != "" },
		// Who asked is the caller the server names.
		caller: func(r *api.CancelRequest, who string) { r.RequestedBy = who },
		do:     h.doCancel,
	}
}

func (h *handlers) doCancel(r api.CancelRequest, v viewer) (any, error) {
	if err := checkNames(r.TenantID, r.InvocationID); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.known(ctx, r.TenantID, r.InvocationID); err != nil {
		return nil, err
	}
	// Only the agent that made a call, or one that sees all, cancels it. A
	// call no stage has claimed yet has no agent recorded: its cancel is
	// taken, as the agent that just published it needs, naming the agent
	// that asked; execute honours it only on that agent's call.
	if rec, err := h.store.Status(ctx, r.TenantID, r.InvocationID); err == nil && rec.Seq != 0 && !v.sees(rec.Agent) {
		return nil, h.notOwn(v, "cancel", r.TenantID, r.InvocationID, "")
	}
	by := v.agent
	if v.all {
		by = ""
	}
	var sig string
	if h.signCancel != nil {
		sig = h.signCancel(r.TenantID, r.InvocationID, by)
	}
	rec, err := h.store.UpdateRecord(ctx, r.TenantID, r.InvocationID, func(rec *api.Record) {
		if rec.CancelRequested && rec.CancelBy == "" && by != "" {
			return // a cancel by one who sees every call stands
		}
		rec.CancelRequested, rec.CancelSig, rec.CancelBy = true, sig, by
	})
	if err != nil {
		return nil, err
	}
	if !rec.Status.Terminal() {
		m := &nats.Msg{Subject: subjects.Cancel(r.TenantID, r.InvocationID)}
		if h.sign != nil {
			m.Header = h.sign(m.Subject, nil, nil)
		}
		if err := h.nc.PublishMsg(m); err != nil {
			return nil, err
		}
		if rec.Status == api.StatusPendingApproval {
			err := h.approvals.Cancel(ctx, r.TenantID, r.InvocationID, cmp.Or(r.RequestedBy, "cancel"), r.Reason)
			if err != nil && !errors.Is(err, &api.Error{Code: api.StateConflict}) {
				return nil, err
			}
		}
	}
	return rec, nil
}

// known returns nil when invocation id of tenant has a record or is in
// flight, else invocation_not_found.
func (h *handlers) known(ctx context.Context, tenant, id string) error {
	_, err := h.store.Status(ctx, tenant, id)
	if !errors.Is(err, kvstore.ErrNotFound) {
		return err
	}
	found, err := inFlight(ctx, h.js, tenant, id)
	if err != nil || found {
		return err
	}
	// It may have ended, and left the streams, while they were read.
	if _, err := h.store.Status(ctx, tenant, id); !errors.Is(err, kvstore.ErrNotFound) {
		return err
	}
	return notFound(id)
}

// notFound is a fresh error each time: the shared kvstore.ErrNotFound must
// not gain details.
func notFound(id string) error {
	return api.NewError(api.InvocationNotFound, api.EInvocationNotFound, "no invocation %q", id)
}

// decide approves or denies a parked invocation. The reply is the approval
// record without the parked envelope.
func (h *handlers) decide(req micro.Request) {
	var d api.ApprovalDecision
	if err := decode(req.Data(), &d); err != nil {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid,
			`expected {"tenant_id":…, "invocation_id":…, "approve":true, "decided_by":…, "reason":…}`))
		return
	}
	if h.identify != nil {
		// An approver's signature (the operator's as break-glass) names
		// the decider; the body's decided_by is ignored.
		who, ok := h.signedBy(req, "", api.EDeciderUnverified, "a decision")
		if !ok {
			return
		}
		d.DecidedBy = who
		d.Proof = &api.DecisionProof{Subject: req.Subject(), Headers: req.Headers(), Body: req.Data()}
	}
	if err := checkNames(d.Tenant, d.InvocationID); err != nil {
		respondError(req, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := h.approvals.Decide(ctx, d)
	var same *api.Error
	if errors.As(err, &same) && same.ECode == api.EApprovalSamePerson {
		// One person approving twice is an attempt to pass the two-person
		// rule alone: refused and audited.
		h.refuse(req, d.DecidedBy, same)
		return
	}
	if err != nil {
		respondError(req, err)
		return
	}
	a.Invocation = nil
	_ = req.RespondJSON(a)
}

// status answers an invocation's status record.
func (h *handlers) status() request[api.StatusRequest] {
	return request[api.StatusRequest]{
		expected: `{"tenant_id":…, "invocation_id":…}`, scopedExpected: `{"invocation_id":…}`,
		tenant:   func(r *api.StatusRequest) *string { return &r.TenantID },
		complete: func(r *api.StatusRequest) bool { return r.InvocationID != "" },
		do:       h.doStatus,
	}
}

func (h *handlers) doStatus(r api.StatusRequest, v viewer) (any, error) {
	if err := checkNames(r.TenantID, r.InvocationID); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec, err := h.store.Status(ctx, r.TenantID, r.InvocationID)
	if errors.Is(err, kvstore.ErrNotFound) {
		err = notFound(r.InvocationID)
	}
	if err != nil {
		return nil, err
	}
	if !v.sees(rec.Agent) {
		return nil, h.notOwn(v, "status", r.TenantID, r.InvocationID, "")
	}
	if h.site != nil && !rec.Status.Terminal() && rec.ToolID != "" {
		// Resolved now, not stored with the call: the tool's site, and
		// whether that site's link is up.
		if m, err := h.reg.Resolve(rec.ToolID, rec.ToolVersion); err == nil && m.Site != "" {
			if st, err := h.site(ctx, m.Site); err == nil {
				rec.Site = &st
			} else {
				rec.Site = &api.SiteWait{Site: m.Site}
			}
		}
	}
	return rec, nil
}

// budget reports where a session's budget stands: used, remaining of the
// caps the request gives, spending rate and projected depletion.
func (h *handlers) budget() request[api.BudgetRequest] {
	return request[api.BudgetRequest]{
		expected: `{"tenant_id":…, "session":…, "limits":{…}}`, scopedExpected: `{"session":…, "limits":{…}}`,
		tenant:   func(r *api.BudgetRequest) *string { return &r.TenantID },
		complete: func(r *api.BudgetRequest) bool { return r.Session != "" },
		do:       h.doBudget,
	}
}

func (h *handlers) doBudget(r api.BudgetRequest, _ viewer) (any, error) {
	if err := subjects.CheckTenant(r.TenantID); err != nil {
		return nil, api.WrapError(err, api.InvalidParameters, api.EInvalidName, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	u, err := h.store.Usage(ctx, r.TenantID, r.Session)
	if err != nil {
		return nil, err
	}
	return u.Status(r.TenantID, r.Session, r.Limits, time.Now()), nil
}

// get answers a tool's manifest; operators (pending true) also see the
// change held for an imported tool, which agents must not read.
func (h *handlers) get(req micro.Request, pending bool) {
	var r api.ToolRequest
	if err := decode(req.Data(), &r); err != nil || r.ToolID == "" {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, "expected {\"tool_id\":…}"))
		return
	}
	m, err := h.reg.Resolve(r.ToolID, r.Version)
	if err != nil {
		respondError(req, err)
		return
	}
	if p := h.pendingChange(m); pending && p != nil {
		doc, err := withPending(m, p)
		if err != nil {
			respondError(req, err)
			return
		}
		_ = req.Respond(doc)
		return
	}
	_ = req.RespondJSON(m)
}

func (h *handlers) register(req micro.Request) {
	who, ok := h.operator(req, "")
	if !ok {
		return
	}
	var r api.RegisterRequest
	if err := decode(req.Data(), &r); err != nil || len(r.Manifest) == 0 {
		respondError(req, api.NewError(api.InvalidParameters, api.EInvalidManifest,
			"expected {\"manifest\":{…}, \"replace\":false}"))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The record keeps the signed request: readers honour no manifest an
	// operator did not sign (internal/signedstate).
	var proof *api.DecisionProof
	if h.identify != nil {
		proof = &api.DecisionProof{Subject: req.Subject(), Headers: req.Headers(), Body: req.Data()}
	}
	if h.checkManifest != nil {
		m, err := tools.Parse(r.Manifest)
		if err == nil {
			err = h.checkManifest(m)
		}
		if err != nil {
			respondError(req, err)
			return
		}
	}
	if !h.textsAdmitted(ctx, req, who, r) || !h.acceptable(ctx, req, r) || h.holdChange(ctx, req, who, r, proof) {
		return
	}
	m, err := h.store.RegisterSignedTool(ctx, r.Manifest, r.Replace, who, proof)
	if err != nil {
		respondError(req, err)
		return
	}
	// Answer once this process's registry has seen the write, so a caller
	// that registers (or replaces) and then asks for the tool finds it.
	for !h.holds(m) && ctx.Err() == nil {
		time.Sleep(2 * time.Millisecond)
	}
	details := map[string]any{"replace": r.Replace}
	if d := tooldesc.Pinned(r.Manifest); d != "" {
		details["description_digest"] = d
	}
	if fs := tooldesc.Recorded(r.Manifest); len(fs) > 0 {
		details["description_findings"] = fs
	}
	typ := api.TypeToolRegistered
	if r.AcceptDigest != "" {
		typ, details["accepted_digest"] = api.TypeToolChangeAccepted, r.AcceptDigest
	}
	h.audited(ctx, req, typ,
		api.AdminChange{Action: "tools.register", By: who, Target: m.ID + "@" + m.Version, Details: details},
		api.ToolRequest{ToolID: m.ID, Version: m.Version})
}

// scoped serves a tenant-scoped endpoint, tool.svc.<tenant>.<endpoint>:
// the tenant is the subject's. The bus lets an agent publish only on its own
// tenant's subjects, so the subject, never the body, says whose data it is.
func (h *handlers) scoped(fn func(tenant string, req micro.Request)) micro.HandlerFunc {
	return func(req micro.Request) {
		parts := strings.SplitN(req.Subject(), ".", 4)
		if len(parts) < 4 {
			respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, "no tenant in subject %q", req.Subject()))
			return
		}
		if err := subjects.CheckTenant(parts[2]); err != nil {
			respondError(req, api.WrapError(err, api.InvalidParameters, api.EInvalidName, "%v", err))
			return
		}
		fn(parts[2], req)
	}
}

// sameTenant fills an empty body tenant with the subject's, and refuses a
// body naming another tenant (E3014).
func sameTenant(req micro.Request, tenant string, body *string) bool {
	if *body != "" && *body != tenant {
		respondError(req, api.NewError(api.PermissionDenied, api.ETenantMismatch,
			"the request names tenant %q on tenant %q's endpoint", *body, tenant))
		return false
	}
	*body = tenant
	return true
}

// checkNames refuses a tenant or invocation id that cannot name a key (E3019).
func checkNames(tenant, id string) error {
	if err := subjects.CheckTenant(tenant); err != nil {
		return api.WrapError(err, api.InvalidParameters, api.EInvalidName, "%v", err)
	}
	if err := subjects.CheckID(id); err != nil {
		return api.WrapError(err, api.InvalidParameters, api.EInvalidName, "%v", err)
	}
	return nil
}

// callerOf is the caller the server names in a cross-account request's
// Nats-Request-Info header (agents: "agent:<tenant>:<token id>"), or "".
// Within toolgate's own account the header is the client's to write, so
// only requests from another account (acc != the service's) are believed.
func callerOf(req micro.Request) string {
	var info struct {
		Account string `json:"acc"`
		User    string `json:"user"`
	}
	if json.Unmarshal([]byte(req.Headers().Get("Nats-Request-Info")), &info) != nil || info.User == "" {
		return ""
	}
	if info.Account == "" || info.Account == ownAccount {
		return ""
	}
	return info.User
}

// ownAccount is the account toolgate's processes live in (busauth.AccountToolgate).
const ownAccount = "TOOLGATE"

func decode(b []byte, v any) error {
	if len(b) == 0 {
		return errors.New("empty request")
	}
	return json.Unmarshal(b, v)
}

// respondError answers with the micro error headers and the ToolError as the
// body, so both `nats req` users and clients see it. The services protocol
// (ADR-32) requires Nats-Service-Error-Code to be a number, and clients such
// as nats.js parse it as one: it is the E-code's number (3025 for E3025).
// The description repeats the ToolErrorCode and E-code for people reading
// headers; clients decode the body.
func respondError(req micro.Request, err error) {
	te := api.AsError(err)
	body, _ := json.Marshal(te)
	code := api.Number(te.ECode)
	if code == 0 {
		code = api.Number(api.EInternal)
	}
	_ = req.Error(strconv.Itoa(code), te.Error(), body)
}
