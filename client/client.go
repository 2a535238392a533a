// Package client is the Go SDK for toolgate: it publishes tool.invoke
// CloudEvents, waits for results, queries status, follows the audit trail and
// manages the tool registry, using only the public subjects. An Agent
// (NewAgent) holds what an agent may do with its capability token; an
// Operator (New) adds what operator credentials allow.
package client

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// DefaultTimeout bounds a request whose context has no deadline.
const DefaultTimeout = 10 * time.Second

// Agent is what an agent uses, with nothing but its capability token as
// credentials: invoke a tool and wait for it, follow its hand-offs, its
// status and cancel, its budget, its tenant's tools, approvals and audit
// trail, and capability requests. Every request goes to its tenant's
// scoped endpoints (tool.svc.<tenant>.…), the only ones the bus lets an
// agent call.
type Agent struct {
	nc *nats.Conn
	js jetstream.JetStream
	// refusals fails a request the bus refused at once (see watchRefusals).
	refusals *refusals
	// Source is the CloudEvent source of invocations this client sends.
	Source string
	// AgentDID is the agent whose calls' results Wait and Follow read
	// live (tool.result.<tenant>.<agent>.<id>, docs/contract.md): an
	// agent's connection may subscribe to its own agent's results only.
	// NewAgent sets it to the agent_did of the capability token nc
	// connected with, unless the token may read its whole tenant's; empty
	// reads any agent's, which operators and tenant readers may.
	AgentDID string
}

// Operator is what an operator uses: everything an Agent does, for any
// tenant, and the administration an operator's credentials allow: the tool
// registry, approval decisions, the whole audit trail, statistics, and the
// administrative endpoints (policy, hooks, revocations, breakers, models,
// budgets).
type Operator struct {
	*Agent
	// Sign, when set, signs the administrative requests (PushPolicy,
	// RevokeToken, SetBreaker, …): on an authenticated bus toolgate refuses
	// them unsigned (E3219) and records the signing operator as who made
	// the change.
	Sign Sign
}

// Client is the operator's client, every method of Agent and Operator.
type Client = Operator

// NewAgent returns an agent's client over nc.
func NewAgent(nc *nats.Conn) (*Agent, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	a := &Agent{nc: nc, js: js, Source: "urn:toolgate:client", refusals: watchRefusals(nc)}
	// An agent's token is its connect token: its own results are the
	// ones its connection may read, so Wait subscribes to those rather
	// than to a subject the bus refuses. An operator's connect token is
	// a role's credential without agent_did.
	if c, err := api.ReadTokenClaims(nc.Opts.Token); err == nil && !c.TenantReader {
		a.AgentDID = c.AgentDID
	}
	return a, nil
}

// New returns an operator's client over nc (NewAgent for an agent).
func New(nc *nats.Conn) (*Operator, error) {
	a, err := NewAgent(nc)
	if err != nil {
		return nil, err
	}
	return &Operator{Agent: a}, nil
}

// InvokeOptions adjust one invocation event.
type InvokeOptions struct {
	// ID is the invocation id; empty generates a UUID.
	ID string
	// TraceParent starts the invocation inside an existing trace.
	TraceParent string
}

// NewEvent builds the tool.invoke CloudEvent for req.
func (c *Agent) NewEvent(req api.Request, o InvokeOptions) (*api.Event, error) {
	id := o.ID
	if id == "" {
		id = newUUID()
	}
	e, err := api.NewEvent(id, c.Source, api.TypeInvoke, req)
	if err != nil {
		return nil, err
	}
	if o.TraceParent != "" {
		e.Extensions = map[string]string{"traceparent": o.TraceParent}
	}
	return e, nil
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// Invoke publishes req for tenant req.AgentContext.TenantID in binary mode
// and returns the invocation id once JetStream has accepted it.
func (c *Agent) Invoke(ctx context.Context, req api.Request, o InvokeOptions) (string, error) {
	e, err := c.NewEvent(req, o)
	if err != nil {
		return "", err
	}
	h, body, err := e.Binary()
	if err != nil {
		return "", err
	}
	tenant := req.AgentContext.TenantID
	nats.Header(h).Set(nats.MsgIdHdr, api.InvokeMsgID(tenant, e.Source, e.ID))
	msg := &nats.Msg{Subject: subjects.Invoke(tenant), Header: h, Data: body}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	ctx, done := c.refusals.track(ctx, msg.Subject)
	defer done()
	if _, err := c.js.PublishMsg(ctx, msg); err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, ctx.Err()) {
			return "", cause
		}
		return "", fmt.Errorf("publishing invocation: %w", err)
	}
	return e.ID, nil
}

// Wait returns the response of invocation id of tenant, waiting until it
// arrives or ctx ends. Results are kept in a stream, so Wait works after the
// fact too.
func (c *Agent) Wait(ctx context.Context, tenant, id string) (api.Response, error) {
	// A live subscription and the status record, both of which an agent's
	// credentials allow (reading the results stream through a consumer is
	// an operator's right): the record answers a result published before
	// the subscription, the subscription one published after.
	subject := subjects.ResultAnyAgent(tenant, id)
	if c.AgentDID != "" {
		subject = subjects.Result(tenant, c.AgentDID, id)
	}
	sub, err := c.nc.SubscribeSync(subject)
	if err != nil {
		return api.Response{}, fmt.Errorf("reading results: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// The flush needs a deadline of its own: Wait's context may have none
	// (it waits as long as the call takes), nats.go's flush requires one.
	fctx, cancel := ctx, context.CancelFunc(func() {})
	if _, ok := ctx.Deadline(); !ok {
		fctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
	}
	err = c.nc.FlushWithContext(fctx)
	cancel()
	if err != nil {
		return api.Response{}, fmt.Errorf("reading results: %w", err)
	}
	for {
		if rec, err := c.Status(ctx, tenant, id); err == nil && rec.Status.Terminal() && rec.Response != nil {
			return *rec.Response, nil
		}
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		msg, err := sub.NextMsgWithContext(wctx)
		cancel()
		switch {
		case err == nil && isAccepted(msg.Data):
			// the pending answer to an async request
		case err == nil:
			return DecodeResult(msg.Data)
		case ctx.Err() != nil:
			return api.Response{}, fmt.Errorf("waiting for %s: %w", id, ctx.Err())
		}
	}
}

// maxFollow bounds Follow: more than a hook chain can hold (docs/hooks.md).
const maxFollow = 8

// Follow waits for invocation id like Wait and, while a hook handed the call
// on to a retry or fallback (execution_metadata.hook.handed_to), for that
// invocation in turn. It returns every response, the final one last.
func (c *Agent) Follow(ctx context.Context, tenant, id string) ([]api.Response, error) {
	var out []api.Response
	for range maxFollow {
		r, err := c.Wait(ctx, tenant, id)
		if err != nil {
			return out, err
		}
		out = append(out, r)
		md := r.ExecutionMetadata
		if md == nil || md.Hook == nil || md.Hook.HandedTo == "" {
			return out, nil
		}
		id = md.Hook.HandedTo
	}
	return out, fmt.Errorf("following %s: more than %d invocations", id, maxFollow)
}

func isAccepted(data []byte) bool {
	var head struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(data, &head) == nil && head.Type == api.TypeAccepted
}

// DecodeResult reads a tool.result CloudEvent.
func DecodeResult(data []byte) (api.Response, error) {
	e, err := api.DecodeStructured(data)
	if err != nil {
		return api.Response{}, fmt.Errorf("decoding result event: %w", err)
	}
	var r api.Response
	if len(e.Data) == 0 {
		return r, nil
	}
	if err := json.Unmarshal(e.Data, &r); err != nil {
		return api.Response{}, fmt.Errorf("decoding result: %w", err)
	}
	return r, nil
}

// Status asks the control service for an invocation's record.
func (c *Agent) Status(ctx context.Context, tenant, id string) (api.Record, error) {
	var rec api.Record
	if err := checkTenant(tenant); err != nil {
		return rec, err
	}
	err := c.request(ctx, subjects.TenantSvc(tenant, subjects.SvcStatus), api.StatusRequest{TenantID: tenant, InvocationID: id}, &rec)
	return rec, err
}

// checkTenant refuses, before any subject is built, a tenant toolgate would
// refuse (E3019): such a name cannot address a tenant's endpoints.
func checkTenant(tenant string) error {
	if err := subjects.CheckTenant(tenant); err != nil {
		return api.WrapError(err, api.InvalidParameters, api.EInvalidName, "%v", err)
	}
	return nil
}

// Budget reports where a session's budget stands against limits, on
// tenant's scoped endpoint (which agents and operators alike may call).
func (c *Agent) Budget(ctx context.Context, tenant, session string, limits api.BudgetLimits) (api.BudgetStatus, error) {
	var st api.BudgetStatus
	if err := checkTenant(tenant); err != nil {
		return st, err
	}
	err := c.request(ctx, subjects.TenantSvc(tenant, subjects.SvcBudget), api.BudgetRequest{TenantID: tenant, Session: session, Limits: limits}, &st)
	return st, err
}

// ListTools lists the registered tools.
func (c *Operator) ListTools(ctx context.Context, f api.ListRequest) (api.ListResponse, error) {
	var out api.ListResponse
	err := c.request(ctx, subjects.SvcToolsList, f, &out)
	return out, err
}

// GetTool returns the manifest of a tool version (empty version: latest) as JSON.
func (c *Operator) GetTool(ctx context.Context, id, version string) (json.RawMessage, error) {
	var out json.RawMessage
	err := c.request(ctx, subjects.SvcToolsGet, api.ToolRequest{ToolID: id, Version: version}, &out)
	return out, err
}

// GetTenantTool is GetTool on tenant's scoped endpoint, the one an agent of
// tenant may call.
func (c *Agent) GetTenantTool(ctx context.Context, tenant, id, version string) (json.RawMessage, error) {
	if err := checkTenant(tenant); err != nil {
		return nil, err
	}
	var out json.RawMessage
	err := c.request(ctx, subjects.TenantSvc(tenant, subjects.SvcToolsGet), api.ToolRequest{ToolID: id, Version: version}, &out)
	return out, err
}

// RegisterTool registers a manifest document. With c.Sign the audit
// event of the registration names the signing operator.
func (c *Operator) RegisterTool(ctx context.Context, manifest []byte, replace bool) (api.ToolRequest, error) {
	var out api.ToolRequest
	err := c.admin(ctx, subjects.SvcToolsRegister, api.RegisterRequest{Manifest: manifest, Replace: replace}, &out)
	return out, err
}

// TokenKeys returns the public key set (a JWKS document) the deployment
// verifies capability tokens with, as it is now: from tenant's endpoint,
// which an agent of tenant may call, or with tenant "" the operators'.
func (c *Agent) TokenKeys(ctx context.Context, tenant string) (json.RawMessage, error) {
	subject := subjects.SvcTokensKeys
	if tenant != "" {
		if err := checkTenant(tenant); err != nil {
			return nil, err
		}
		subject = subjects.TenantSvc(tenant, subjects.SvcTokensKeys)
	}
	var out json.RawMessage
	err := c.request(ctx, subject, struct{}{}, &out)
	return out, err
}

func (c *Agent) request(ctx context.Context, subject string, in, out any) error {
	return c.requestSigned(ctx, subject, in, out, nil)
}

// Sign returns the headers that prove who sends body on subject (toolgate's
// busauth.Signer.Sign over a toolgate credentials file).
type Sign func(subject string, body []byte) (nats.Header, error)

func (c *Agent) requestSigned(ctx context.Context, subject string, in, out any, sign Sign) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: subject, Data: body}
	if sign != nil {
		if m.Header, err = sign(subject, body); err != nil {
			return fmt.Errorf("signing the request: %w", err)
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	ctx, done := c.refusals.track(ctx, subject)
	defer done()
	msg, err := c.nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, ctx.Err()) {
			return cause // refused by the bus, said at once
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%s: no answer in time (is the control service running?): %w", subject, err)
		}
		return fmt.Errorf("%s: %w", subject, err)
	}
	if msg.Header.Get(micro.ErrorCodeHeader) != "" {
		var te api.Error
		if json.Unmarshal(msg.Data, &te) == nil && te.Code != "" {
			return &te
		}
		return fmt.Errorf("%s: %s %s", subject, msg.Header.Get(micro.ErrorCodeHeader), msg.Header.Get(micro.ErrorHeader))
	}
	return json.Unmarshal(msg.Data, out)
}

// Tail calls fn with every audit event of tenant (all tenants when empty),
// from the start of the stream when all is set, else only new ones, until
// ctx ends or fn returns an error.
func (c *Operator) Tail(ctx context.Context, tenant string, all bool, fn func(subject string, data []byte) error) error {
	return c.TailSeq(ctx, tenant, all, func(_ uint64, subject string, data []byte) error { return fn(subject, data) })
}

// TailSeq is Tail that also hands fn each event's sequence in the AUDIT
// stream, by which AuditAt reads it again.
func (c *Operator) TailSeq(ctx context.Context, tenant string, all bool, fn func(seq uint64, subject string, data []byte) error) error {
	filter := subjects.AuditAll
	if tenant != "" {
		filter = subjects.AuditTenant(tenant)
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverNewPolicy}
	if all {
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	// Refused JetStream requests get no answer: say so at once.
	jsCtx, done := c.refusals.track(ctx, "$JS.API.>")
	cons, err := c.js.OrderedConsumer(jsCtx, subjects.StreamAudit, cfg)
	done()
	if err != nil && consumerRefused(jsCtx) {
		// A person's credentials: read by direct gets instead.
		return c.tailDirect(ctx, filter, all, fn)
	}
	if err != nil {
		return refusedOr(jsCtx, fmt.Errorf("reading audit: %w", err))
	}
	it, err := cons.Messages()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		var seq uint64
		if md, err := msg.Metadata(); err == nil {
			seq = md.Sequence.Stream
		}
		if err := fn(seq, msg.Subject(), msg.Data()); err != nil {
			it.Stop()
			return err
		}
	}
}

// refusedOr is the bus's refusal that ended ctx, if one did, else err.
func refusedOr(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		return cause
	}
	return err
}

// TailLast calls fn with the last n audit events of tenant (all tenants
// when empty) that the stream held when it was called, oldest first, and
// returns: fewer when fewer exist, none when none do.
func (c *Operator) TailLast(ctx context.Context, tenant string, n int, fn func(subject string, data []byte) error) error {
	return c.TailLastSeq(ctx, tenant, n, func(_ uint64, subject string, data []byte) error { return fn(subject, data) })
}

// TailLastSeq is TailLast that also hands fn each event's sequence in the
// AUDIT stream, by which AuditAt reads it again.
func (c *Operator) TailLastSeq(ctx context.Context, tenant string, n int, fn func(seq uint64, subject string, data []byte) error) error {
	filter := subjects.AuditAll
	if tenant != "" {
		filter = subjects.AuditTenant(tenant)
	}
	jsCtx, untrack := c.refusals.track(ctx, "$JS.API.>")
	st, err := c.js.Stream(jsCtx, subjects.StreamAudit)
	if err != nil {
		untrack()
		return refusedOr(jsCtx, fmt.Errorf("reading audit: %w", err))
	}
	info, err := st.Info(jsCtx, jetstream.WithSubjectFilter(filter))
	untrack()
	if err != nil {
		return refusedOr(jsCtx, fmt.Errorf("reading audit: %w", err))
	}
	var stored uint64
	for _, k := range info.State.Subjects {
		stored += k
	}
	if stored == 0 || n <= 0 {
		return nil
	}
	skip := uint64(0)
	if stored > uint64(n) {
		skip = stored - uint64(n)
	}
	var seen uint64
	done := errors.New("caught up")
	err = c.TailSeq(ctx, tenant, true, func(seq uint64, subject string, data []byte) error {
		seen++
		if seen <= skip {
			return nil
		}
		if err := fn(seq, subject, data); err != nil {
			return err
		}
		if seen >= stored {
			return done
		}
		return nil
	})
	if errors.Is(err, done) {
		return nil
	}
	return err
}

// TailLive calls fn with every audit event of tenant published from now
// on, until ctx ends or fn returns an error. It subscribes to the audit
// subjects instead of reading the stream (agents may not create
// consumers), which operators and an agent with a tenant reader's token
// may; any other agent's connection is refused that subscription (audit
// subjects name no agent), and TailLive then pages through the tenant's
// audit.history endpoint, which answers the agent's own calls' events.
func (c *Agent) TailLive(ctx context.Context, tenant string, fn func(subject string, data []byte) error) error {
	if err := checkTenant(tenant); err != nil {
		return err
	}
	filter, start := subjects.AuditTenant(tenant), time.Now()
	sub, err := c.nc.SubscribeSync(filter)
	if err != nil {
		return fmt.Errorf("reading audit: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// The server's answer to the subscription (a refusal) comes before the
	// flush's.
	if err := c.nc.FlushTimeout(DefaultTimeout); err != nil {
		return fmt.Errorf("reading audit: %w", err)
	}
	if err := c.nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), filter) {
		return c.tailHistory(ctx, tenant, start, fn)
	}
	for {
		msg, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// The refusal may come only once the subscription is read.
			if errors.Is(err, nats.ErrPermissionViolation) {
				return c.tailHistory(ctx, tenant, start, fn)
			}
			return err
		}
		if err := fn(msg.Subject, msg.Data); err != nil {
			return err
		}
	}
}

// tailHistory is TailLive through the tenant's audit.history endpoint:
// the events stored from since on, asked for again every tailPoll.
func (c *Agent) tailHistory(ctx context.Context, tenant string, since time.Time, fn func(subject string, data []byte) error) error {
	r := api.AuditHistoryRequest{Since: &since, PageSize: 200}
	for {
		page, err := c.AuditHistory(ctx, tenant, r)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, e := range page.Events {
			if err := fn(e.Subject, e.Event); err != nil {
				return err
			}
		}
		r.Cursor, r.Since = page.NextCursor, nil
		if page.More {
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(tailPoll):
		}
	}
}

// tailPoll is how often tailHistory asks for new events.
const tailPoll = 500 * time.Millisecond

// Decide approves or denies a parked invocation. Of several decisions on
// one invocation only the first counts; later ones fail with E3215.
func (c *Operator) Decide(ctx context.Context, d api.ApprovalDecision) (api.Approval, error) {
	return c.DecideSigned(ctx, d, nil)
}

// DecideSigned is Decide with the request signed by sign: on an
// authenticated bus toolgate records the signing operator as the decider
// and refuses unsigned decisions (E3217).
//
// An approval names the request it approves (d.RequestDigest): pass the
// digest of the ApprovalSummary the decider reviewed. Without one,
// DecideSigned reads the approval first and approves the request parked
// now.
func (c *Operator) DecideSigned(ctx context.Context, d api.ApprovalDecision, sign Sign) (api.Approval, error) {
	var out api.Approval
	if d.Approve && d.RequestDigest == "" {
		s, err := c.Approval(ctx, d.Tenant, d.InvocationID)
		if err != nil {
			return out, err
		}
		d.RequestDigest = s.RequestDigest
	}
	err := c.requestSigned(ctx, subjects.SvcApproval, d, &out, sign)
	return out, err
}

// Cancel asks toolgate to stop an invocation and returns its record as it
// was when the request was recorded.
func (c *Agent) Cancel(ctx context.Context, tenant, id, reason string) (api.Record, error) {
	var rec api.Record
	if err := checkTenant(tenant); err != nil {
		return rec, err
	}
	err := c.request(ctx, subjects.TenantSvc(tenant, subjects.SvcCancel), api.CancelRequest{TenantID: tenant, InvocationID: id, Reason: reason}, &rec)
	return rec, err
}

// DeleteTool removes one version of a tool: it serves no call any more,
// and its manifest, returned, stays readable with lifecycle state removed
// and who removed it when. With c.Sign the audit event of the removal
// names the signing operator.
func (c *Operator) DeleteTool(ctx context.Context, id, version string) (json.RawMessage, error) {
	var out json.RawMessage
	err := c.admin(ctx, subjects.SvcToolsDelete, api.ToolRequest{ToolID: id, Version: version}, &out)
	return out, err
}

// AcceptToolChange serves the change held for an imported tool's
// version (its server changed what it says about the tool): the held
// manifest, as tools.get shows it, is registered again under c's
// signature with digest named, which must be the held change's (E3868).
func (c *Operator) AcceptToolChange(ctx context.Context, id, version, digest string) (api.ToolRequest, error) {
	doc, err := c.GetTool(ctx, id, version)
	if err != nil {
		return api.ToolRequest{}, err
	}
	var got struct {
		Version string             `json:"version"`
		Pending *api.PendingChange `json:"pending_change"`
	}
	if err := json.Unmarshal(doc, &got); err != nil {
		return api.ToolRequest{}, err
	}
	if got.Version != version {
		return api.ToolRequest{}, api.NewError(api.ToolNotFound, api.EToolNotFound, "%s has no version %s (give the exact version)", id, version)
	}
	if got.Pending == nil {
		return api.ToolRequest{}, api.NewError(api.StateConflict, api.EToolChangeNone, "no change of tool %s version %s is held", id, version)
	}
	var out api.ToolRequest
	err = c.admin(ctx, subjects.SvcToolsRegister, api.RegisterRequest{Manifest: got.Pending.Manifest, Replace: true, AcceptDigest: digest}, &out)
	return out, err
}

// PurgeTool deletes one version of a tool for good, manifest and all.
func (c *Operator) PurgeTool(ctx context.Context, id, version string) error {
	var out api.ToolRequest
	return c.admin(ctx, subjects.SvcToolsPurge, api.ToolRequest{ToolID: id, Version: version}, &out)
}

// Approvals lists tenant's calls waiting for a human's decision, on
// tenant's scoped endpoint.
func (c *Agent) Approvals(ctx context.Context, tenant string) ([]api.ApprovalSummary, error) {
	var out api.ApprovalsResponse
	if err := checkTenant(tenant); err != nil {
		return nil, err
	}
	err := c.request(ctx, subjects.TenantSvc(tenant, subjects.SvcApprovalsList), api.ApprovalsRequest{Tenant: tenant}, &out)
	return out.Approvals, err
}

// Approval returns the approval of one invocation, in any state.
func (c *Agent) Approval(ctx context.Context, tenant, id string) (api.ApprovalSummary, error) {
	var out api.ApprovalSummary
	if err := checkTenant(tenant); err != nil {
		return out, err
	}
	err := c.request(ctx, subjects.TenantSvc(tenant, subjects.SvcApprovalsGet), api.ApprovalsRequest{Tenant: tenant, InvocationID: id}, &out)
	return out, err
}

// SetLifecycle moves one version of a tool on in its lifecycle (state,
// deprecated_in_favor_of, deprecation_date, sunset_at, …): the manifest is
// read and registered again with the given lifecycle members replaced and
// the others kept.
func (c *Operator) SetLifecycle(ctx context.Context, id, version string, lifecycle map[string]any) (api.ToolRequest, error) {
	doc, err := c.GetTool(ctx, id, version)
	if err != nil {
		return api.ToolRequest{}, err
	}
	var m map[string]any
	if err := json.Unmarshal(doc, &m); err != nil {
		return api.ToolRequest{}, err
	}
	if v, _ := m["version"].(string); v != version {
		return api.ToolRequest{}, api.NewError(api.ToolNotFound, api.EToolNotFound, "%s has no version %s (give the exact version)", id, version)
	}
	// Not the manifest's: the change held for an imported tool.
	delete(m, "pending_change")
	merged, _ := m["lifecycle"].(map[string]any)
	if merged == nil {
		merged = map[string]any{}
	}
	for k, v := range lifecycle {
		merged[k] = v
	}
	m["lifecycle"] = merged
	b, err := json.Marshal(m)
	if err != nil {
		return api.ToolRequest{}, err
	}
	return c.RegisterTool(ctx, b, true)
}

// SearchTools searches, filters and ranks the tools on tenant's scoped
// endpoint (an agent's way in; empty tenant: the operators' endpoint). A
// next page is the same request with Cursor set to the answer's NextCursor.
func (c *Agent) SearchTools(ctx context.Context, tenant string, r api.ListRequest) (api.ListResponse, error) {
	subject := subjects.SvcToolsList
	if tenant != "" {
		if err := checkTenant(tenant); err != nil {
			return api.ListResponse{}, err
		}
		subject = subjects.TenantSvc(tenant, subjects.SvcToolsList)
	}
	var out api.ListResponse
	err := c.request(ctx, subject, r, &out)
	return out, err
}

// ToolStats returns the usage statistics of one tool, or of every tool
// when id is empty (operators).
func (c *Operator) ToolStats(ctx context.Context, id string) (api.StatsResponse, error) {
	var out api.StatsResponse
	err := c.request(ctx, subjects.SvcToolsStats, api.StatsRequest{ToolID: id}, &out)
	return out, err
}

// ModelStats returns the cluster-wide model statistics: latency, success
// rate, failures, tokens and cost per model and task type, filtered and
// grouped as r asks (operators).
func (c *Operator) ModelStats(ctx context.Context, r api.ModelStatsRequest) (api.ModelStatsResponse, error) {
	var out api.ModelStatsResponse
	err := c.request(ctx, subjects.SvcModelsStats, r, &out)
	return out, err
}

// RequestCapability sends a capability request for tenant and
// returns the matched tools and, when policy grants one, a child token.
// Every constraint is sent as given: start from
// api.DefaultCapabilityConstraints, since Go's zero values (network
// allowed, writable input, no limits) are the permissive ones and zero
// limits are refused (E3040). A refusal is in the answer (Outcome refused,
// Refusal), not an error; the error is for a request toolgate could not
// take (E3040, E3201, ...).
func (c *Agent) RequestCapability(ctx context.Context, tenant string, r api.CapabilityRequest) (api.CapabilityResponse, error) {
	if r.Kind == "" {
		r.Kind = api.CapabilityRequestKind
	}
	b, err := json.Marshal(r)
	if err != nil {
		return api.CapabilityResponse{}, err
	}
	return c.RequestCapabilityJSON(ctx, tenant, b)
}

// RequestCapabilityJSON sends a capability request as the agent wrote it;
// constraints it leaves out take toolgate's restrictive defaults.
func (c *Agent) RequestCapabilityJSON(ctx context.Context, tenant string, doc []byte) (api.CapabilityResponse, error) {
	if err := checkTenant(tenant); err != nil {
		return api.CapabilityResponse{}, err
	}
	var out api.CapabilityResponse
	err := c.request(ctx, subjects.TenantSvc(tenant, subjects.SvcCapabilityRequest), json.RawMessage(doc), &out)
	return out, err
}

// CapabilityReport returns the run report of a capability request of
// tenant: what was asked, matched and granted, and what the grant used.
func (c *Agent) CapabilityReport(ctx context.Context, tenant, id string) (api.CapabilityReport, error) {
	if err := checkTenant(tenant); err != nil {
		return api.CapabilityReport{}, err
	}
	var out api.CapabilityReport
	err := c.request(ctx, subjects.TenantSvc(tenant, subjects.SvcCapabilityReport), api.CapabilityReportRequest{RequestID: id}, &out)
	return out, err
}

// AuditHistory returns a page of tenant's stored audit events, oldest
// first, on tenant's scoped endpoint: an agent reads its own tenant's
// history this way (it may create no consumer). Give r.Cursor the previous
// page's NextCursor for the next one.
func (c *Agent) AuditHistory(ctx context.Context, tenant string, r api.AuditHistoryRequest) (api.AuditHistoryResponse, error) {
	var out api.AuditHistoryResponse
	if err := checkTenant(tenant); err != nil {
		return out, err
	}
	r.TenantID = tenant
	err := c.request(ctx, subjects.TenantSvc(tenant, subjects.SvcAuditHistory), r, &out)
	return out, err
}

// Receipt asks tenant's scoped endpoint for invocation id's signed
// receipt and, once a checkpoint covers its terminal audit event, its
// inclusion proof (docs/audit.md#receipts): an agent gets its own calls'
// receipts, auditors and operators any.
func (c *Agent) Receipt(ctx context.Context, tenant, id string) (api.ReceiptResponse, error) {
	var out api.ReceiptResponse
	if err := checkTenant(tenant); err != nil {
		return out, err
	}
	err := c.request(ctx, subjects.TenantSvc(tenant, subjects.SvcReceipt), api.ReceiptRequest{TenantID: tenant, InvocationID: id}, &out)
	return out, err
}
