// Package audit is the last stage and the single finaliser: it writes the
// terminal status, the terminal audit event and the result of every
// invocation, whichever stage ended it.
package audit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	segjson "github.com/segmentio/encoding/json"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/signedstate"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// store is what audit reads and writes (*kvstore.Store): the status record
// and the session's usage.
type store interface {
	Status(ctx context.Context, tenant, id string) (api.Record, error)
	SetStatus(ctx context.Context, rec api.Record) (api.Record, bool, error)
	UpdateUsage(ctx context.Context, tenant, session string, change func(*kvstore.Usage) error) (kvstore.Usage, error)
}

var _ store = (*kvstore.Store)(nil)

// statsRecorder counts tool calls for discovery's ranking
// (*kvstore.StatsRecorder: this process's own shard, no shared key).
type statsRecorder interface {
	Record(ctx context.Context, tool string, success bool, latencyMS int64, cost float64) error
	Flush(ctx context.Context) error
}

// Auditor implements the audit stage.
type Auditor struct {
	store store
	hooks *Hooks // nil: no hooks run
	stats statsRecorder
	// receipts signs every terminal result's receipt; nil: none.
	receipts *auditchain.ReceiptSigner
	// recovery, when the hops live in memory: see RecoverEndings.
	recovery *recovery
}

// recovery is what RecoverEndings set.
type recovery struct {
	since     time.Time
	window    time.Duration
	published func(ctx context.Context, subject string) (bool, error)
}

// RecoverEndings is for hops kept in memory (topology.MemoryHops), whose
// messages a restart of the server at since lost: an ending recorded
// before since whose call comes back re-driven had its message, and maybe
// its outputs, lost with them. Its outputs are published again from its
// status record, never the re-driven call's: within window (the duplicate
// window of the audit and results streams) their message ids keep one
// copy; past it, only when published reports that the result subject
// holds none.
func (a *Auditor) RecoverEndings(since time.Time, window time.Duration, published func(ctx context.Context, subject string) (bool, error)) {
	a.recovery = &recovery{since: since, window: window, published: published}
}

// lostEnding reports whether stored, the terminal record of rec's call,
// was written by an ending whose message a restart lost (RecoverEndings)
// and whose outputs must be published again from it.
func (a *Auditor) lostEnding(ctx context.Context, stored api.Record, rec api.Record, inv *envelope.Invocation) (bool, error) {
	r := a.recovery
	if r == nil || !stored.Status.Terminal() || stored.Seq != rec.Seq || stored.Response == nil ||
		!stored.UpdatedAt.Before(r.since) || !strings.HasPrefix(stored.Ending, subjects.StreamPipeline+":") {
		return false, nil
	}
	if time.Since(stored.UpdatedAt) < r.window {
		return true, nil
	}
	has, err := r.published(ctx, subjects.Result(inv.Tenant, inv.Agent(), inv.ID))
	if err != nil {
		return false, stages.Transient(fmt.Errorf("looking for the result of an ending recorded before the restart: %w", err), 0)
	}
	return !has, nil
}

var _ stages.Finaliser = (*Auditor)(nil)

// New returns an Auditor writing status to store and usage statistics to
// a shard of its own. With h it runs hooks on every ended invocation before
// it finalises it (docs/hooks.md).
func New(s *kvstore.Store, h *Hooks) *Auditor {
	if h != nil && h.Store == nil {
		h.Store = s
	}
	return &Auditor{store: s, hooks: h, stats: s.NewStatsRecorder()}
}

// SignReceipts makes every terminal result carry a receipt signed by s
// (docs/audit.md#receipts).
func (a *Auditor) SignReceipts(s *auditchain.ReceiptSigner) { a.receipts = s }

// FlushStats writes the tool statistics recorded and not written yet
// (kvstore.StatsRecorder coalesces its writes): call it once the stage's
// runners have drained.
func (a *Auditor) FlushStats(ctx context.Context) error {
	if a.stats == nil {
		return nil
	}
	return a.stats.Flush(ctx)
}

// Finalises implements stages.Finaliser: audit is where every invocation
// ends.
func (a *Auditor) Finalises() {}

// Process implements stages.Stage. It is idempotent: on a redelivery the
// status write finds its own record and the outputs carry the same ids.
func (a *Auditor) Process(ctx context.Context, inv *envelope.Invocation) ([]stages.Output, error) {
	if !inv.Terminal() {
		inv.Fail(subjects.Audit, api.NewError(api.InternalError, api.EInternal,
			"invocation reached audit without a terminal status (last stage %q)", inv.EndedBy))
	}
	if stages.Swept(inv.Error) {
		// Before hooks, aborts and charges: none of them may act on an
		// ending that does not stand.
		held, err := a.heldByWorker(ctx, inv)
		if err != nil {
			return nil, stages.Transient(fmt.Errorf("reading status: %w", err), 0)
		}
		if held {
			return nil, nil
		}
	}
	if inv.Error != nil && inv.Error.ECode == api.EDuplicateInvocation {
		return a.duplicate(inv)
	}
	if inv.Tenant == subjects.SystemTenant {
		// The event's tenant could not name a subject (E3019): there is no
		// tenant to keep a status for or to answer, only the audit trail.
		terminal, err := stages.AuditEvent(subjects.Audit, inv, envelope.TerminalType(inv), inv.Audit())
		return []stages.Output{terminal}, err
	}
	// Hooks decide what follows the outcome, before it is recorded: the
	// status may say the call was skipped or handed to another.
	decision, err := a.hooks.decide(ctx, inv)
	if errors.Is(err, errForgedDecision) {
		// No hook runs on a decision audit did not make; the refusal is
		// audited and the invocation ends as it would have.
		o, oerr := signedstate.RefusedEvent("urn:toolgate:"+subjects.Audit, "hook-decision."+inv.Tenant+"."+subjects.Token(inv.ID), inv.Event.Seq, err)
		if oerr == nil {
			oerr = stages.Announce(ctx, o)
		}
		if oerr != nil && !errors.Is(oerr, stages.ErrNoAnnouncer) {
			return nil, stages.Transient(oerr, 0)
		}
		decision, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	if decision != nil {
		apply(inv, decision)
		if decision.Session != "" {
			if err := a.hooks.Store.AbortSession(ctx, inv.Tenant, decision.Session, inv.ID, decision.Hook); err != nil {
				return nil, stages.Transient(fmt.Errorf("aborting the session: %w", err), 0)
			}
		}
	} else if inv.Request != nil && inv.Request.Link != nil {
		inv.Metadata.Hook = &api.HookOutcome{Parent: inv.Request.Link.Parent}
	}
	if inv.Request != nil && inv.Request.Redrive != nil {
		rd := inv.Request.Redrive
		inv.Metadata.Redrive = &api.RedriveOutcome{Original: rd.Original, Root: rd.Root, Depth: rd.Depth, By: rd.By,
			Decision: rd.Decision, Reason: rd.Reason}
	}
	resp := inv.Response()
	typ := envelope.TerminalType(inv)
	// The result is made first: its receipt, which the status records,
	// names its bytes.
	now := time.Now()
	result, err := a.result(inv, &resp, a.receipt(inv, typ, now), now)
	if err != nil {
		return nil, err
	}
	rec := api.Record{
		InvocationID: inv.ID, Tenant: inv.Tenant, Status: inv.Status,
		ToolID: inv.ToolID(), ToolVersion: inv.ToolVersion(), Error: inv.Error,
		Response: &resp, Seq: inv.Event.Seq, Ending: stages.Input(ctx),
	}
	rec.Agent = inv.Agent()
	// The charge comes before the status: a caller that sees the end (the
	// client reads the status record) and calls again must find this call
	// charged, or its next call is judged without it (a failure not yet
	// counted towards approval_after_failures). A session's usage is
	// charged once per invocation, so an ending that then loses to
	// another charges nothing the winner's would add.
	if err := a.charge(ctx, inv); err != nil {
		return nil, stages.Transient(fmt.Errorf("charging the session budget: %w", err), 0)
	}
	stored, written, err := a.store.SetStatus(ctx, rec)
	if err != nil {
		return nil, stages.Transient(fmt.Errorf("recording status: %w", err), 0)
	}
	recovered := false
	if !written {
		if recovered, err = a.lostEnding(ctx, stored, rec, inv); err != nil {
			return nil, err
		}
	}
	if recovered {
		// The outcome recorded stands, whatever the re-driven call came to.
		inv.Status, inv.Error, inv.Result = stored.Status, stored.Error, stored.Response.Result
		if md := stored.Response.ExecutionMetadata; md != nil {
			inv.Metadata = *md
		}
		resp, typ, decision = *stored.Response, envelope.TerminalType(inv), nil
		if result, err = a.again(inv, resp); err != nil {
			return nil, err
		}
	} else if !written && secondEnding(stored, rec) {
		// Another message ended this invocation first (execute's success
		// on its way through verify, then a redelivery of execute's input
		// declaring E3023): that ending is the one recorded and published,
		// this one is dropped.
		return nil, nil
	}
	if written {
		// After the status and the charge, which callers wait on.
		a.count(ctx, inv)
	} else if stored.Response != nil && stored.Response.Receipt != nil {
		// A redelivery of the ending recorded: its receipt is the one the
		// record holds, so the event and result carry the same.
		resp.Receipt = stored.Response.Receipt
		if result, err = a.again(inv, resp); err != nil {
			return nil, err
		}
	}
	data := inv.Audit()
	data.Receipt = resp.Receipt
	terminal, err := stages.AuditEvent(subjects.Audit, inv, typ, data)
	if err != nil {
		return nil, err
	}
	outs := make([]stages.Output, 0, 4)
	if invoked, ok := carriedInvoked(inv); ok && !recovered {
		outs = append(outs, invoked)
	}
	outs = append(outs, terminal, result)
	if decision != nil && decision.Child != nil {
		child, err := childEvent(inv, decision.Child)
		if err != nil {
			return nil, err
		}
		outs = append(outs, child)
	} else if dl, ok, err := deadLetter(inv, time.Now()); err != nil {
		return nil, err
	} else if ok {
		outs = append(outs, dl)
	}
	return outs, nil
}

// receipt is the receipt of inv's ending, whose terminal audit event has
// type typ, issued at now, not signed yet (result signs it): the hashes of
// the parameters and the result, nothing else computed. Nil without
// receipts.
func (a *Auditor) receipt(inv *envelope.Invocation, typ string, now time.Time) *api.Receipt {
	if a.receipts == nil {
		return nil
	}
	r := &api.Receipt{V: api.ReceiptVersion, InvocationID: inv.ID, Tenant: inv.Tenant, Agent: inv.Agent(),
		ToolID: inv.ToolID(), ToolVersion: inv.ToolVersion(), Status: inv.Status,
		ResultSHA256: auditchain.Digest(inv.Result),
		EventID:      inv.ID + ":" + envelope.SubjectSuffix(typ),
		IssuedAt:     now.UTC().Format(time.RFC3339Nano)}
	if !inv.ReceivedAt.IsZero() {
		r.ReceivedAt = inv.ReceivedAt.UTC().Format(time.RFC3339Nano)
	}
	if inv.Request != nil {
		r.ParamsSHA256 = auditchain.Digest(inv.Request.Parameters)
	}
	if inv.Error != nil {
		r.ErrorCode = inv.Error.ECode
	}
	switch az := inv.Authz; {
	case az != nil:
		r.Decision, r.PolicyRevision, r.ManifestDigest = "allow", az.PolicyRevision, az.ManifestDigest
		r.Approvers, r.Approval = az.Approvers, az.ApprovalProof
		if len(r.Approvers) == 0 && az.ApprovedBy != "" {
			r.Approvers = []string{az.ApprovedBy}
		}
	case inv.EndedBy == subjects.Authorize && inv.Status == api.StatusPermissionDenied:
		r.Decision = "deny"
	}
	for _, d := range inv.Metadata.DocumentsAccessed {
		r.Documents = append(r.Documents, api.DocumentPin{Source: d.Source, DocumentID: d.DocumentID, Version: d.Version})
	}
	return r
}

// result is the result message of inv's ending, resp. With a receipt r it
// is sealed by r (docs/audit.md#receipts): the message bears r as its
// last member and r, signed once, names the rest of its bytes, so that
// one signature proves both and the publisher signs nothing more; resp
// then carries r. Without one it is signed as every message is. now is
// when r was issued: its issued_at, written to the nanosecond, is the same
// instant, which a redelivery reads back (again).
func (a *Auditor) result(inv *envelope.Invocation, resp *api.Response, r *api.Receipt, now time.Time) (stages.Output, error) {
	if r == nil {
		return resultEvent(inv, *resp, now)
	}
	o, end, err := bareResult(inv, *resp, now)
	if err != nil {
		return o, err
	}
	if o.Data, err = a.receipts.SealResult(r, o.Data, end); err != nil {
		return o, err
	}
	resp.Receipt = r
	o.Header[auditchain.HeaderSeal] = []string{auditchain.SealReceipt}
	return o, nil
}

// again is the result message of an ending recorded before, resp with its
// recorded receipt: the same bytes, sealed by the same receipt. A receipt
// that names other bytes (a receipt of version 1, made before receipts
// sealed their results) rides in a message signed as every message is.
func (a *Auditor) again(inv *envelope.Invocation, resp api.Response) (stages.Output, error) {
	r := resp.Receipt
	if r == nil || r.Ending == "" {
		return resultEvent(inv, resp, time.Now())
	}
	at, _ := time.Parse(time.RFC3339Nano, r.IssuedAt)
	o, end, err := bareResult(inv, resp, at)
	if err != nil || !auditchain.EndingMatches(r, o.Data) {
		return resultEvent(inv, resp, time.Now())
	}
	if o.Data, err = auditchain.CarryReceipt(o.Data, end, r); err != nil {
		return o, err
	}
	o.Header[auditchain.HeaderSeal] = []string{auditchain.SealReceipt}
	return o, nil
}

// bareResult is the result message of resp without its receipt, as of at
// (the receipt's issued_at, so that a redelivery makes the same bytes),
// and the index in it of the brace that closes resp.
func bareResult(inv *envelope.Invocation, resp api.Response, at time.Time) (stages.Output, int, error) {
	resp.Receipt = nil
	// The CloudEvent's data is resp's encoding as it is, followed by the
	// event's extensions alone.
	return resultMessage(inv, resp, at)
}

// heldByWorker reports whether inv's record says a live worker holds the
// invocation: parked for approval, or running its tool. A sweep's ending
// is then refused; the worker ends the invocation itself.
func (a *Auditor) heldByWorker(ctx context.Context, inv *envelope.Invocation) (bool, error) {
	rec, err := a.store.Status(ctx, inv.Tenant, inv.ID)
	if errors.Is(err, api.ErrInvocationNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if rec.Status.Terminal() || (rec.Seq != 0 && rec.Seq != inv.Event.Seq) {
		return false, nil // first-ending-wins and repeats are decided below
	}
	return rec.Status == api.StatusPendingApproval || rec.Status == api.StatusRunning, nil
}

// duplicate ends a later publish under an id another publish holds
// (validate's E3024). The id names one invocation, whose first publish has
// the one terminal event, status and result; the later publish, whether a
// client's re-publish of the same request past the invoke stream's
// duplicate window or a different request reusing the id, leaves a
// tool.duplicate event and nothing in the status record, the session's
// usage or the hooks. A repeat of the same request is answered by the first
// one's result on the same subject; a different request gets its refusal
// there, so that its caller learns why.
func (a *Auditor) duplicate(inv *envelope.Invocation) ([]stages.Output, error) {
	data := inv.Audit()
	if sameRequest(inv.Error) {
		ev, err := stages.AuditEvent(subjects.Audit, inv, api.TypeDuplicate, data)
		return []stages.Output{ev}, err
	}
	resp := inv.Response()
	now := time.Now()
	result, err := a.result(inv, &resp, a.receipt(inv, api.TypeDuplicate, now), now)
	if err != nil {
		return nil, err
	}
	data.Receipt = resp.Receipt
	ev, err := stages.AuditEvent(subjects.Audit, inv, api.TypeDuplicate, data)
	if err != nil {
		return nil, err
	}
	return []stages.Output{ev, result}, nil
}

// count adds a call that reached its tool to the tool's usage statistics,
// once (the caller saw the terminal status written). Statistics inform
// ranking only: a failed write is retried with the next call, never a
// reason to hold back the invocation's end.
func (a *Auditor) count(ctx context.Context, inv *envelope.Invocation) {
	if a.stats == nil || inv.Metadata.StartedAt == "" || inv.ToolID() == "" {
		return
	}
	cost := 0.0
	if inv.Authz != nil {
		cost = inv.Authz.CostPerCall
	}
	if mu := inv.Metadata.Model; mu != nil {
		cost += mu.Cost
	}
	_ = a.stats.Record(ctx, inv.ToolID(), inv.Status == api.StatusSuccess, inv.Metadata.DurationMS, cost)
}

// charge adds an admitted invocation's runtime and cost to its session's
// usage and counts consecutive failures; a call whose tool never ran gives
// its reserved call back and counts as neither success nor failure.
func (a *Auditor) charge(ctx context.Context, inv *envelope.Invocation) error {
	az := inv.Authz
	if az == nil || !az.Reserved || az.Unmetered {
		return nil // never admitted, or without a budget: nothing was reserved
	}
	if err := a.chargeKey(ctx, inv, az.Session); err != nil {
		return err
	}
	if az.TokenBudget != "" {
		return a.chargeKey(ctx, inv, az.TokenBudget)
	}
	return nil
}

// chargeKey charges inv's end to the usage under one budget key, once.
func (a *Auditor) chargeKey(ctx context.Context, inv *envelope.Invocation, key string) error {
	az := inv.Authz
	_, err := a.store.UpdateUsage(ctx, inv.Tenant, key, func(u *kvstore.Usage) error {
		if u.HasSettled(inv.ID) {
			return errSettled
		}
		if neverRan(inv) {
			u.Calls = max(u.Calls-1, 0)
			u.Release(inv.ID)
			u.Settle(inv.ID)
			return nil
		}
		u.RuntimeMS += inv.Metadata.DurationMS
		if inv.Metadata.StartedAt != "" {
			u.Cost += az.CostPerCall // charged once the tool ran
		}
		if mu := inv.Metadata.Model; mu != nil {
			u.Tokens += mu.Tokens()
			u.Cost += mu.Cost
		}
		if inv.Status == api.StatusSuccess {
			u.ConsecutiveFailures = 0
		} else {
			u.ConsecutiveFailures++
		}
		u.Release(inv.ID) // what a model call held, now charged as used
		u.Settle(inv.ID)
		return nil
	})
	if errors.Is(err, errSettled) {
		return nil
	}
	return err
}

// secondEnding reports whether stored, the terminal status already written
// for rec's publish, came from another message than rec: the first ending
// wins. A redelivery of the message that wrote stored publishes its outputs
// again (they carry the same message ids), in case the first delivery died
// before publishing them.
func secondEnding(stored, rec api.Record) bool {
	if !stored.Status.Terminal() || stored.Seq != rec.Seq {
		return false // a reuse of the id by another request ends on its own
	}
	if stored.Ending != "" && rec.Ending != "" {
		return stored.Ending != rec.Ending
	}
	return stored.Status != rec.Status || errCode(stored.Error) != errCode(rec.Error)
}

func errCode(e *api.Error) string {
	if e == nil {
		return ""
	}
	return e.ECode
}

// sameRequest reports a refused second publish of an event already taken.
func sameRequest(e *api.Error) bool {
	if e == nil || e.ECode != api.EDuplicateInvocation {
		return false
	}
	same, _ := e.Details["same_request"].(bool)
	return same
}

var errSettled = errors.New("already settled")

// neverRan reports a call refused after authorize reserved it and before
// its tool started: at route (a rate limit, a removed tool), or at execute
// before the run (calls running at once, a cancel, an idempotency
// conflict). A call execute found interrupted (E3023), or ended on a
// delivery limit or an internal error, may have run.
func neverRan(inv *envelope.Invocation) bool {
	if inv.Metadata.StartedAt != "" || inv.Error == nil {
		return false
	}
	switch inv.EndedBy {
	case subjects.Route:
		return true
	case subjects.Execute:
		switch inv.Error.ECode {
		case api.EOutcomeUnknown, api.EDeliveryExhausted, api.EInternal:
			return false
		}
		return true
	}
	return false
}

// carriedInvoked is the tool.invoked event execute carried with the
// invocation (envelope.Invocation.Invoked), as audit publishes it: only
// execute's event of that type about this very invocation, under the
// message id execute's own announcement would have had.
func carriedInvoked(inv *envelope.Invocation) (stages.Output, bool) {
	if len(inv.Invoked) == 0 {
		return stages.Output{}, false
	}
	suffix := envelope.SubjectSuffix(api.TypeInvoked)
	var e struct {
		Type    string `json:"type"`
		ID      string `json:"id"`
		Source  string `json:"source"`
		Subject string `json:"subject"`
		Tenant  string `json:"tenantid"`
	}
	// The event came in a hand-off whose seal was checked, valid JSON
	// (Decode scans what it did not write): the fast codec reads it, as
	// the envelope's decoder does.
	if segjson.Unmarshal(inv.Invoked, &e) != nil || e.Type != api.TypeInvoked || e.ID != inv.ID+":"+suffix ||
		e.Source != "urn:toolgate:"+subjects.Execute || e.Subject != inv.ID || e.Tenant != inv.Tenant {
		return stages.Output{}, false
	}
	return stages.EncodedEventOutput(subjects.AuditEvent(inv.Tenant, suffix), inv.MsgID("audit."+suffix), inv.Invoked), true
}

func resultEvent(inv *envelope.Invocation, resp api.Response, at time.Time) (stages.Output, error) {
	o, _, err := resultMessage(inv, resp, at)
	return o, err
}

// resultMessage is the result event of resp, as of at, and the index in
// it of the last byte of resp's encoding.
func resultMessage(inv *envelope.Invocation, resp api.Response, at time.Time) (stages.Output, int, error) {
	o, end, err := stages.InvocationEvent(subjects.Result(inv.Tenant, inv.Agent(), inv.ID), inv, "urn:toolgate:"+subjects.Audit, api.TypeResult, resp, at)
	o.MsgID = inv.MsgID("result")
	return o, end, err
}
