// Package execute is the fourth stage: it runs the tool the route stage
// chose, within its time limit, and records how it went.
package execute

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	"github.com/failsafe-go/failsafe-go/timeout"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/backoff"
	"github.com/toolgate/toolgate/internal/breaker"
	"github.com/toolgate/toolgate/internal/detect"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/stages/execute/builtin"
	"github.com/toolgate/toolgate/stages/execute/kind"
	"github.com/toolgate/toolgate/stages/verify"
	"github.com/toolgate/toolgate/subjects"
)

// invokedGrace is how long a tool runs before execute announces its
// tool.invoked on its own; a quicker tool's event travels with its ending.
const invokedGrace = 100 * time.Millisecond

// Kind runs the tools of one manifest kind other than builtin; its
// contract is kind.Runner. The kinds a binary runs are declared in
// stages/execute/kinds and installed with Install.
type Kind = kind.Runner

// store is what execute reads and writes (*kvstore.Store): the invocation's
// status record (its claim), idempotency keys and checkpoints.
type store interface {
	Status(ctx context.Context, tenant, id string) (api.Record, error)
	SetStatus(ctx context.Context, rec api.Record) (api.Record, bool, error)
	ClaimRun(ctx context.Context, rec api.Record, fill func(prev api.Record, next *api.Record)) (api.Record, bool, api.Record, bool, error)
	UpdateRecord(ctx context.Context, tenant, id string, change func(*api.Record)) (api.Record, error)
	ClaimIdempotencyKey(ctx context.Context, tenant, key, id, digest string) (kvstore.IdempotencyClaim, error)
	SaveCheckpoint(ctx context.Context, cp api.Checkpoint, state json.RawMessage, parent *kvstore.CheckpointParent) (api.Checkpoint, error)
	LoadCheckpoint(ctx context.Context, tenant, id string) (api.Checkpoint, json.RawMessage, error)
	LatestCheckpoint(ctx context.Context, tenant, inv string) (api.Checkpoint, bool, int, error)
}

var _ store = (*kvstore.Store)(nil)

// Executor implements the execute stage.
type Executor struct {
	reg      *tools.Registry
	builtins builtin.Set
	store    store
	running  *Running
	// Breakers, when set, guard tools that configure a circuit breaker.
	Breakers *breaker.Breakers
	// Publish, when set, announces checkpoints on the audit stream as they
	// are made: they must not wait for the tool to end.
	Publish func(context.Context, stages.Output) error
	// Verifier holds a failed call's error text to the tool's output
	// policy (failed calls skip the verify stage); nil uses the shipped
	// detector rules with no tenant settings.
	Verifier *verify.Verifier
	// SiteScrub, set at a site (docs/sites.md), redacts the secrets its
	// detectors find in a result before the result leaves the site; verify
	// at the hub applies the whole output policy after.
	SiteScrub *detect.Engine
	// Quota, when set, bounds the calls of one tenant running at once.
	Quota *TenantQuota
	// Documents, when set, resolves a call's document_context before its
	// tool runs; without it such a call fails E3602.
	Documents Documents
	// Seals, when set, is the check every call must pass before anything
	// else: a seal of authorize's decision that verifies (*seal.Verifier).
	// A refusal ends the call permission_denied (E3218), audited as every
	// refusal is.
	Seals Seals
	// CancelSigned, when set, is the check a status record's cancel flag
	// must pass to stop a call: the control service's signature over the
	// tenant and invocation id (seal.Messages.CancelSigned). Any stage may
	// write the status bucket; a flag without that signature is ignored,
	// and reported to Refused.
	CancelSigned func(tenant, id, by, sig string) bool
	// Refused, when set, audits a shared record execute ignored because
	// its owner did not sign it (what names it, cause says why).
	Refused func(ctx context.Context, what string, rev uint64, cause error)
	// MicroInterval spaces the micro checkpoints of tools whose manifest
	// and request say nothing of it; zero writes every state a tool reports.
	MicroInterval time.Duration
	// Defaults, when set, are each tenant's defaults where a manifest is
	// silent: the retry policy of idempotent tools, the breaker, the calls
	// one agent may run at once (counted in AgentRuns, when set).
	Defaults  func(tenant string) tools.Defaults
	AgentRuns AgentRuns
	kinds     map[string]Kind
	// runners are the failsafe executors of calls (runner).
	runners  sync.Map // runnerKey → failsafe.Executor[json.RawMessage]
	nrunners atomic.Int32
}

// Seals checks that an invocation carries authorize's sealed decision.
type Seals interface {
	Check(inv *envelope.Invocation, now time.Time) error
}

// Handle makes x run tools of the named kind with k.
func (x *Executor) Handle(kind string, k Kind) {
	if x.kinds == nil {
		x.kinds = map[string]Kind{}
	}
	x.kinds[kind] = k
}

// Install builds every kind of reg that has a constructor with d, and
// makes x run its tools; builtin tools x runs itself.
func (x *Executor) Install(reg *kind.Registry, d *kind.Deps) error {
	return reg.Build(d, x.Handle)
}

// Kind returns what runs tools of the named kind, or nil.
func (x *Executor) Kind(kind string) Kind { return x.kinds[kind] }

var (
	_ stages.Stage = (*Executor)(nil)
	_ stages.Gate  = (*Executor)(nil)
)

// Defer implements stages.Gate: a call of a tenant at its quota is put back
// before a worker decodes it.
func (x *Executor) Defer(subject string, delivered, max int) (time.Duration, bool) {
	tenant, ok := subjects.TenantOfPipe(subject)
	if !ok {
		return 0, false
	}
	return x.Quota.Defer(tenant, delivered, max)
}

// New returns an Executor running builtins. It records each invocation as
// running in store before the tool starts.
// running, when not nil, lets cancel announcements stop the tools it runs.
func New(reg *tools.Registry, builtins builtin.Set, store *kvstore.Store, running *Running) *Executor {
	if running == nil {
		running = NewRunning()
	}
	return &Executor{reg: reg, builtins: builtins, store: store, running: running}
}

// Process implements stages.Stage. The result is left for verify; only a
// failure ends the invocation here.
func (x *Executor) Process(ctx context.Context, inv *envelope.Invocation) (_ []stages.Output, err error) {
	if err := siteOverdue(inv, time.Now()); err != nil {
		return nil, err
	}
	if x.Seals != nil {
		if err := x.Seals.Check(inv, time.Now()); err != nil {
			return nil, err
		}
	}
	m, err := x.reg.Resolve(inv.Route.ToolID, inv.Route.ToolVersion)
	if err != nil {
		return nil, err
	}
	var defaults tools.Defaults
	if x.Defaults != nil {
		defaults = x.Defaults(inv.Tenant)
	}
	// The agent's slot comes before the tenant's quota: a call refused
	// for the one takes nothing of the other.
	endRun, err := x.claimAgentRun(ctx, inv, m, defaults)
	if err != nil {
		return nil, err
	}
	defer endRun()
	release, err := x.Quota.Acquire(ctx, inv.Tenant)
	if err != nil {
		return nil, err
	}
	defer release()
	fn, err := x.function(m, inv)
	if err != nil {
		return nil, err
	}
	if inv.Request.DryRun() {
		return nil, x.dryRun(ctx, inv, m)
	}
	if key := idempotencyKey(inv.Request); key != "" {
		replayed, err := x.replay(ctx, inv, m, key)
		if err != nil || replayed {
			return nil, err
		}
	}
	// Register before claiming: a cancel is written to KV before it is
	// announced, so it is either seen by the claim or delivered here.
	// The record is read under the context the call came with: its
	// bucket read then shares the stages' bound (kvstore) instead of
	// making one of its own, and a cancel is read from the record anyway.
	callCtx := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer x.running.add(inv.Tenant, inv.ID, cancel)()
	// Claim the invocation: a redelivery of one that already ended must not
	// run the tool again. A redelivery is the same ingest sequence; a record
	// of another sequence is another request that reused the id, whose
	// outcome is never handed to this one. The record read by the same
	// compare-and-swap tells whether an earlier delivery started the tool
	// on a worker that is gone (it says running).
	//
	// A tool that may run again (claimLater) is not claimed before it
	// starts: its record is read for the same answers, and running is
	// written only once it has run for invokedGrace, so a quick call's
	// status is written by validate and audit alone (docs/delivery.md).
	later := claimLater(m)
	var prev, rec api.Record
	var existed bool
	if later {
		prev, existed, err = x.record(callCtx, inv)
		rec = prev
	} else {
		prev, existed, rec, _, err = x.store.ClaimRun(ctx, runRecord(inv, m), keepResumable)
	}
	if err != nil {
		return nil, stages.Transient(fmt.Errorf("recording running status: %w", err), 0)
	}
	if (existed && !ownedBy(prev, inv)) || !ownedBy(rec, inv) {
		return nil, duplicate(inv)
	}
	interrupted := existed && prev.Status == api.StatusRunning
	if rec.Status.Terminal() {
		inv.Status, inv.Error, inv.EndedBy = rec.Status, rec.Error, subjects.Execute
		if rec.Response != nil {
			inv.Result = rec.Response.Result
		}
		return nil, nil
	}
	if rec.CancelRequested {
		switch {
		case x.CancelSigned != nil && !x.CancelSigned(inv.Tenant, inv.ID, rec.CancelBy, rec.CancelSig):
			x.refused(ctx, "cancel_flag:"+inv.Tenant+"/"+inv.ID, inv.Event.Seq, api.NewError(api.PermissionDenied, api.ECancelUnsigned,
				"the cancel flag on invocation %s is not signed by the control service: written into the status bucket by another role; ignored", inv.ID))
		case rec.CancelBy != "" && rec.CancelBy != inv.Agent():
			// Taken before any stage recorded whose call it is.
			x.refused(ctx, "cancel_flag:"+inv.Tenant+"/"+inv.ID, inv.Event.Seq, api.NewError(api.PermissionDenied, api.ECancelNotOwn,
				"the cancel of invocation %s was asked by agent %q, not by the call's agent; ignored", inv.ID, rec.CancelBy))
		default:
			return nil, cancelled(m)
		}
	}
	// Until the tool starts, a failure that is retried (a checkpoint's
	// load, the breaker's shared state) gives the claim back, so that the
	// redelivery runs the tool rather than taking a run that never began
	// for an interrupted one.
	started := false
	defer func() {
		if _, retried := stages.IsTransient(err); retried && !started && !later {
			x.unclaim(ctx, inv, prev, existed)
		}
	}()
	tr := x.newTracker(ctx, inv, m)
	found, err := x.resumeFrom(ctx, inv, m.ID, tr, interrupted)
	if err != nil {
		return nil, err
	}
	if interrupted && !found && !m.Safety.Idempotent {
		// The interrupted run's tool.invoked, should its worker have died
		// before announcing it; one it announced is the same message id.
		inv.Status = api.StatusRunning
		if invoked, err := stages.AuditEvent(subjects.Execute, inv, api.TypeInvoked, inv.Audit()); err == nil {
			inv.Invoked = invoked.Data
		}
		return nil, api.NewError(api.ToolExecutionError, api.EOutcomeUnknown,
			"%s was interrupted mid-run on another worker; it is not idempotent and left no checkpoint, "+
				"so whether it took effect is unknown and it is not run again", m.Key())
	}
	defer func() { inv.Metadata.CheckpointsCreated = tr.createdList() }()
	params := inv.Request.Parameters
	if wantsDocuments(inv) {
		pins := inv.DocumentPins
		if len(pins) == 0 {
			pins = rec.DocumentPins
		}
		if params, err = x.documents(ctx, inv, m, pins, true); err != nil {
			return nil, err
		}
	}
	ctx = kind.WithProgress(ctx, tr)
	if inv.Authz != nil {
		ctx = builtin.WithGrants(ctx, inv.Authz.Grants.Paths)
	}
	meter := &kind.Meter{}
	ctx = kind.WithMeter(ctx, meter)
	var guard *breaker.Call
	if x.Breakers != nil {
		if guard, err = x.Breakers.Acquire(ctx, m.WithBreaker(defaults)); err != nil {
			return nil, err
		}
	}
	inv.Status = api.StatusRunning
	invoked, err := stages.AuditEvent(subjects.Execute, inv, api.TypeInvoked, inv.Audit())
	if err != nil {
		return nil, err
	}
	started = true
	// tool.invoked says a call started: a watcher sees it while the tool
	// runs. A tool done within invokedGrace has its event carried to
	// audit with its ending instead (as has one whose announcement
	// failed), under the same message id.
	// A call claimed later is claimed then, before its tool.invoked goes.
	var claim func()
	if later {
		claim = func() { _, _, _, _, _ = x.store.ClaimRun(ctx, runRecord(inv, m), keepResumable) }
	}
	announce := stages.AnnounceAfterFunc(ctx, invokedGrace, claim, invoked)
	defer func() {
		if announce.Withdraw() {
			inv.Invoked = invoked.Data
		}
	}()
	var outs []stages.Output
	limit := Limit(m, inv.Request)
	start := time.Now()
	var attempts atomic.Int32 // a timed-out attempt may still be running
	var result json.RawMessage
	if p := m.EffectiveRetry(defaults); retried(p) {
		result, err = x.runner(m, p, limit).WithContext(ctx).
			GetWithExecution(func(exec failsafe.Execution[json.RawMessage]) (json.RawMessage, error) {
				attempts.Store(int32(exec.Attempts()))
				return call(exec.Context(), fn, params)
			})
	} else {
		attempts.Store(1)
		result, err = runOnce(ctx, limit, fn, params)
	}
	tr.finish(err != nil)
	inv.Metadata.Attempts = int(attempts.Load())
	inv.Metadata.Model = meter.Model()
	meter.FillMetadata(&inv.Metadata)
	inv.Metadata.Warnings = append(inv.Metadata.Warnings, cpuShareWarning(m, inv.Request, meter)...)
	guard.End(ctx, err, time.Since(start))
	end := time.Now()
	inv.Metadata.StartedAt = start.UTC().Format(time.RFC3339Nano)
	inv.Metadata.CompletedAt = end.UTC().Format(time.RFC3339Nano)
	inv.Metadata.DurationMS = end.Sub(start).Milliseconds()
	if errors.Is(context.Cause(ctx), ErrCancelRequested) {
		return outs, cancelled(m)
	}
	if err != nil {
		return outs, x.checkError(m, inv, classify(err, m, limit))
	}
	if !json.Valid(result) {
		return outs, api.NewError(api.ToolExecutionError, api.EResultNotJSON, "%s returned invalid JSON", m.Key())
	}
	inv.Result = x.scrub(inv, result)
	return outs, nil
}

// maxSiteFindings bounds the findings a site records of one result.
const maxSiteFindings = 16

// scrub redacts, at a site, the secrets in a result before it leaves for
// the hub, and records each as a finding of the call.
func (x *Executor) scrub(inv *envelope.Invocation, result []byte) []byte {
	if x.SiteScrub == nil {
		return result
	}
	red, fs, err := x.SiteScrub.RedactJSON(result, detect.Secrets)
	if err != nil {
		return result // not JSON: Process refused it already
	}
	for i, f := range fs {
		if i == maxSiteFindings {
			break
		}
		inv.Findings = append(inv.Findings, envelope.Finding{Rule: f.Rule, Detector: string(f.Detector), Path: f.Path,
			Action: "redact", RulesVersion: x.SiteScrub.Version()})
	}
	return red
}

// dryRun ends a dry run where the tool would start: the executor exists
// and the documents the call asks for pass the document policy (their
// versions are not pinned), then the call succeeds without a result and
// nothing is claimed, run or charged.
func (x *Executor) dryRun(ctx context.Context, inv *envelope.Invocation, m *tools.Manifest) error {
	if wantsDocuments(inv) {
		if _, err := x.documents(ctx, inv, m, inv.DocumentPins, false); err != nil {
			return err
		}
	}
	inv.Metadata.DryRun = true
	inv.Metadata.ToolID, inv.Metadata.ToolVersion = m.ID, m.Version
	inv.Succeed(subjects.Execute, nil)
	return nil
}

// refused reports a record execute ignored, when it has where to.
func (x *Executor) refused(ctx context.Context, what string, rev uint64, cause error) {
	if x.Refused != nil {
		x.Refused(ctx, what, rev, cause)
	}
}

// claimLater reports whether a call of m is claimed only once it has run
// for invokedGrace, as its tool.invoked is announced, not before it
// starts (a claim that fails then is not retried: the run goes on, and its
// ending is written as ever). An idempotent tool may run again after a
// crash, by its own declaration, so nothing needs its run recorded
// durably first; a model tool's run costs money, and is claimed first
// whatever it declares (as no default policy retries it).
func claimLater(m *tools.Manifest) bool { return m.Safety.Idempotent && m.Kind != "model" }

// runRecord is the record that claims inv's run of m.
func runRecord(inv *envelope.Invocation, m *tools.Manifest) api.Record {
	return api.Record{InvocationID: inv.ID, Tenant: inv.Tenant, Status: api.StatusRunning,
		ToolID: m.ID, ToolVersion: m.Version, Seq: inv.Event.Seq}
}

// keepResumable keeps, in a claim, what a resumed run reads of the record
// before it.
func keepResumable(prev api.Record, next *api.Record) {
	next.Checkpoint, next.DocumentPins = prev.Checkpoint, prev.DocumentPins
}

// record reads inv's status record, as the claim would have found it.
func (x *Executor) record(ctx context.Context, inv *envelope.Invocation) (api.Record, bool, error) {
	rec, err := x.store.Status(ctx, inv.Tenant, inv.ID)
	if errors.Is(err, api.ErrInvocationNotFound) {
		return api.Record{}, false, nil
	}
	return rec, err == nil, err
}

// unclaimTimeout bounds the write that gives a claim back.
const unclaimTimeout = 5 * time.Second

// unclaim puts inv's record back to the status it had before this
// delivery claimed the run, if it still holds that claim. Should the write
// fail, the redelivery finds the call running, as after a crash.
func (x *Executor) unclaim(ctx context.Context, inv *envelope.Invocation, prev api.Record, existed bool) {
	status := api.StatusPending
	if existed {
		status = prev.Status
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unclaimTimeout)
	defer cancel()
	_, _ = x.store.UpdateRecord(ctx, inv.Tenant, inv.ID, func(r *api.Record) {
		if r.Status == api.StatusRunning && r.Seq == inv.Event.Seq {
			r.Status = status
		}
	})
}

// newTracker returns the Progress of one run, spacing micro checkpoints
// by the request's interval, else the manifest's, else the deployment's
// (zero: every one the tool offers is written). A tool that opts out, or a
// request that turns checkpointing off, has none.
func (x *Executor) newTracker(ctx context.Context, inv *envelope.Invocation, m *tools.Manifest) *tracker {
	tr := &tracker{ctx: ctx, store: x.store, publish: x.Publish, inv: inv, toolID: m.ID, toolVer: m.Version}
	tr.interval, tr.micro = m.MicroInterval(x.MicroInterval)
	if cc := inv.Request.CheckpointConfig; cc != nil {
		if cc.EnableCheckpointing != nil && !*cc.EnableCheckpointing {
			tr.micro = false
		}
		if cc.CheckpointIntervalSeconds > 0 {
			tr.interval = time.Duration(cc.CheckpointIntervalSeconds) * time.Second
		}
	}
	// A checkpoint keeps the document versions the call was pinned to, so
	// that a resume from it reads the same ones.
	tr.pins = func() json.RawMessage {
		if len(inv.DocumentPins) == 0 {
			return nil
		}
		b, _ := json.Marshal(inv.DocumentPins)
		return b
	}
	return tr
}

// ownedBy reports whether a stored record belongs to inv's publish (or to no
// publish yet).
func ownedBy(rec api.Record, inv *envelope.Invocation) bool {
	return rec.Seq == 0 || rec.Seq == inv.Event.Seq
}

func duplicate(inv *envelope.Invocation) error {
	return api.NewError(api.InvalidParameters, api.EDuplicateInvocation,
		"invocation id %q is already used in this tenant by another request", inv.ID)
}

func idempotencyKey(req *api.Request) string {
	if req.ExecutionOptions == nil {
		return ""
	}
	return req.ExecutionOptions.IdempotencyKey
}

// replay claims the request's idempotency key for inv. If an earlier
// invocation holds it for the same request and has ended, inv takes over its
// outcome without running the tool (replayed is true); a different request
// under the key, or an earlier one still running, is idempotency_conflict.
func (x *Executor) replay(ctx context.Context, inv *envelope.Invocation, m *tools.Manifest, key string) (replayed bool, err error) {
	digest := requestDigest(m, inv.Request.Parameters)
	claim, err := x.store.ClaimIdempotencyKey(ctx, inv.Tenant, key, inv.ID, digest)
	if err != nil {
		return false, stages.Transient(err, 0)
	}
	if claim.InvocationID == inv.ID {
		return false, nil // ours, first time or redelivered
	}
	if claim.Digest != digest {
		return false, api.NewError(api.IdempotencyConflict, api.EIdempotencyMismatch,
			"idempotency key %q was used by invocation %s for a different request", key, claim.InvocationID).
			WithDetail("original_invocation_id", claim.InvocationID)
	}
	first, err := x.store.Status(ctx, inv.Tenant, claim.InvocationID)
	if err != nil && !errors.Is(err, kvstore.ErrNotFound) {
		return false, stages.Transient(err, 0)
	}
	if err != nil || !first.Status.Terminal() || first.Response == nil {
		return false, api.NewError(api.IdempotencyConflict, api.EIdempotencyInFlight,
			"invocation %s with idempotency key %q has not ended yet", claim.InvocationID, key).
			AsRetryable().WithDetail("original_invocation_id", claim.InvocationID)
	}
	inv.Metadata.ReplayedFrom = claim.InvocationID
	if first.Status == api.StatusSuccess {
		inv.Succeed(subjects.Execute, first.Response.Result)
	} else {
		inv.Status, inv.Error, inv.EndedBy = first.Status, first.Error, subjects.Execute
	}
	return true, nil
}

// requestDigest identifies what a request asks for: tool, version and
// parameters (compacted, so whitespace does not matter).
func requestDigest(m *tools.Manifest, params json.RawMessage) string {
	var buf bytes.Buffer
	if json.Compact(&buf, params) != nil {
		buf.Reset()
		buf.Write(params)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", m.ID, m.Version)
	h.Write(buf.Bytes())
	return hex.EncodeToString(h.Sum(nil))
}

// function returns what runs the tool of m.
func (x *Executor) function(m *tools.Manifest, inv *envelope.Invocation) (kind.Func, error) {
	switch {
	case m.Kind == "builtin" && m.Builtin != nil:
		fn, ok := x.builtins[m.Builtin.Function]
		if !ok {
			return nil, api.NewError(api.ToolExecutionError, api.EExecutorUnavailable,
				"builtin function %q is not in this binary", m.Builtin.Function)
		}
		return fn, nil
	}
	if k, ok := x.kinds[m.Kind]; ok {
		return k.Prepare(m, inv)
	}
	return nil, api.NewError(api.ToolExecutionError, api.EExecutorUnavailable, "no executor for %s tools", m.Kind)
}

// Limit is the time an invocation may run: the tool's limit, narrowed (never
// widened) by the request.
func Limit(m *tools.Manifest, req *api.Request) time.Duration {
	d := m.Timeout()
	if rl := req.ResourceLimits; rl != nil && rl.TimeoutSeconds > 0 {
		d = min(d, time.Duration(rl.TimeoutSeconds)*time.Second)
	}
	return d
}

// CPUShare is a call's CPU share in millicores: the tool's (500 where its
// manifest is silent), narrowed (never widened) by the request.
func CPUShare(m *tools.Manifest, req *api.Request) int64 {
	c := m.CPUMillicores()
	if rl := req.ResourceLimits; rl != nil && rl.CPUMillicoreLimit > 0 {
		c = min(c, int64(rl.CPUMillicoreLimit))
	}
	return c
}

// cpuShareWarning is the warning of a call that asked for a CPU share
// (its manifest or request names one) that was not applied: never
// silently ignored. The default share of a silent manifest warns nobody.
func cpuShareWarning(m *tools.Manifest, req *api.Request, meter *kind.Meter) []string {
	asked := m.Limits.CPUMillicores > 0 || (req.ResourceLimits != nil && req.ResourceLimits.CPUMillicoreLimit > 0)
	applied, noted, why := meter.CPUShare()
	if !asked || applied {
		return nil
	}
	if !noted {
		why = fmt.Sprintf("%s tools run no process of their own per call", m.Kind)
	}
	return []string{fmt.Sprintf("%s: the CPU share of %d millicores was not applied: %s", api.ECPUShareNotApplied, CPUShare(m, req), why)}
}

// maxRunners bounds the runners an Executor keeps; past it it starts
// again with none.
const maxRunners = 512

// runnerKey names the runner of calls of m under retry policy p (by its
// members: the defaults a tenant's calls fall back on are a copy per
// call) and time limit limit.
type runnerKey struct {
	m             *tools.Manifest
	limit         time.Duration
	attempts      int
	base, ceiling int64
	classes       *string // the list of errors retried, by identity
	nclasses      int
	retries       bool
}

// runner is what runs a call of m under retry policy p and time limit
// limit: retry wrapping the per-attempt timeout, in failsafe-go's
// documented order. The policies hold no state of their own (each
// execution keeps its own), so the runner is built once for every call
// of the same tool, policy and limit.
func (x *Executor) runner(m *tools.Manifest, p *tools.RetryPolicy, limit time.Duration) failsafe.Executor[json.RawMessage] {
	k := runnerKey{m: m, limit: limit}
	if p != nil {
		k.retries, k.attempts, k.base, k.ceiling = true, p.MaxAttempts, p.BaseDelayMS, p.MaxDelayMS
		k.classes, k.nclasses = unsafe.SliceData(p.RetryableErrors), len(p.RetryableErrors)
	}
	if r, ok := x.runners.Load(k); ok {
		return r.(failsafe.Executor[json.RawMessage])
	}
	policies := make([]failsafe.Policy[json.RawMessage], 0, 2)
	if rp := retryPolicy(m, p, limit); rp != nil {
		policies = append(policies, rp)
	}
	r := failsafe.With(append(policies, timeout.New[json.RawMessage](limit))...)
	if x.nrunners.Add(1) > maxRunners {
		x.runners.Clear()
		x.nrunners.Store(1)
	}
	x.runners.Store(k, r)
	return r
}

// retried reports whether retry policy p runs a call more than once.
func retried(p *tools.RetryPolicy) bool { return p != nil && p.MaxAttempts >= 2 }

// runOnce runs a call that no retry policy applies to under its time
// limit exactly as a runner of the limit alone does (failsafe-go's
// timeout): the tool runs on the caller's goroutine with a context of its
// own, which the limit cancels; whichever of the tool's return and the
// limit comes first decides, the limit's as timeout.ErrExceeded. It spares
// a quick call the executor's per-call execution state.
func runOnce(ctx context.Context, limit time.Duration, fn kind.Func, params json.RawMessage) (json.RawMessage, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var decided atomic.Bool
	timer := time.AfterFunc(limit, func() {
		if decided.CompareAndSwap(false, true) {
			cancel()
		}
	})
	out, err := call(ctx, fn, params)
	if !decided.CompareAndSwap(false, true) {
		return nil, timeout.ErrExceeded
	}
	timer.Stop()
	return out, err
}

// defaultRetryable are the error classes retried when a retry policy names none.
var defaultRetryable = []string{string(api.Timeout), string(api.ExternalAPIError), string(api.RateLimitExceeded), string(api.DocumentUnavailable)}

// retryPolicy builds p, the retry policy of m's calls: exponential backoff
// with full jitter, for the error classes it lists. A tool is retried only
// when it is idempotent or the error proves nothing ran (details.not_started).
func retryPolicy(m *tools.Manifest, p *tools.RetryPolicy, limit time.Duration) failsafe.Policy[json.RawMessage] {
	if !retried(p) {
		return nil
	}
	classes := p.RetryableErrors
	if len(classes) == 0 {
		classes = defaultRetryable
	}
	base := time.Duration(cmp.Or(p.BaseDelayMS, 100)) * time.Millisecond
	ceiling := time.Duration(cmp.Or(p.MaxDelayMS, 10_000)) * time.Millisecond
	return retrypolicy.NewBuilder[json.RawMessage]().
		WithMaxAttempts(p.MaxAttempts).
		WithDelayFunc(func(exec failsafe.ExecutionAttempt[json.RawMessage]) time.Duration {
			// A Retry-After from the service is a floor: sooner would be refused again.
			return max(backoff.FullJitter(exec.Attempts(), base, ceiling), retryAfter(exec.LastError()))
		}).
		HandleIf(func(_ json.RawMessage, err error) bool {
			if err == nil {
				return false
			}
			te := api.AsError(classify(err, m, limit))
			notStarted, _ := te.Details["not_started"].(bool)
			// A wait beyond the policy's ceiling is left to the caller.
			return slices.Contains(classes, string(te.Code)) && (m.Safety.Idempotent || notStarted) && retryAfter(te) <= ceiling
		}).
		ReturnLastFailure().
		Build()
}

// retryAfter is an error's details.retry_after_ms, or zero.
func retryAfter(err error) time.Duration {
	var te *api.Error
	if !errors.As(err, &te) {
		return 0
	}
	switch v := te.Details["retry_after_ms"].(type) {
	case int64:
		return time.Duration(v) * time.Millisecond
	case int:
		return time.Duration(v) * time.Millisecond
	case float64:
		return time.Duration(v * float64(time.Millisecond))
	}
	return 0
}

func cancelled(m *tools.Manifest) error {
	return api.NewError(api.Cancelled, api.ECancelled, "%s was cancelled on request", m.Key())
}

// errPanic marks a builtin that panicked.
var errPanic = errors.New("tool panicked")

func call(ctx context.Context, fn kind.Func, params json.RawMessage) (out json.RawMessage, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = nil, fmt.Errorf("%w: %v", errPanic, p)
		}
	}()
	return fn(ctx, params)
}

// checkError applies the output policy to the text of a failed call.
func (x *Executor) checkError(m *tools.Manifest, inv *envelope.Invocation, err error) error {
	v := x.Verifier
	if v == nil {
		v = verify.New(x.reg, verify.Config{})
	}
	return v.CheckError(m, inv, err)
}

func classify(err error, m *tools.Manifest, limit time.Duration) error {
	switch {
	case errors.Is(err, timeout.ErrExceeded), errors.Is(err, context.DeadlineExceeded):
		return api.NewError(api.Timeout, api.ETimeout, "%s exceeded its %v time limit", m.Key(), limit).AsRetryable()
	case errors.Is(err, errPanic):
		return api.WrapError(err, api.ToolExecutionError, api.EToolPanicked, "%s failed unexpectedly", m.Key())
	}
	var te *api.Error
	if errors.As(err, &te) {
		return te
	}
	return api.WrapError(err, api.ToolExecutionError, api.EToolFailed, "%s: %v", m.Key(), err)
}

// siteOverdue ends a call that waited at the hub for its site past its
// deadline, route's (Route.SiteDeadline) or its authorization's (the
// token's expiry): it never runs, and the caller learns which site it
// waited for.
func siteOverdue(inv *envelope.Invocation, now time.Time) error {
	r := inv.Route
	if r == nil || r.Site == "" {
		return nil
	}
	deadline := r.SiteDeadline
	if inv.Authz != nil && inv.Authz.Seal != nil {
		if exp := time.UnixMilli(inv.Authz.Seal.Expires); deadline.IsZero() || exp.Before(deadline) {
			deadline = exp
		}
	}
	if deadline.IsZero() || !now.After(deadline) {
		return nil
	}
	return api.NewError(api.Timeout, api.ESiteTimeout,
		"the call waited at the hub for site %s until its deadline %s passed; it never ran", r.Site, deadline.UTC().Format(time.RFC3339)).
		WithDetail("site", r.Site)
}
