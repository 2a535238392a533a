package node_test

import (
	"context"
	"encoding/json"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/breaker"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRateLimitAcrossWorkers: three route processes share one tool's bucket
// of ten calls (refilling one an hour): exactly ten of forty calls run, the
// rest end rate_limit_exceeded, retryable, with a retry-after and a
// rate_limited audit event.
func TestRateLimitAcrossWorkers(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{Stages: allBut(subjects.Route)})
	for range 3 {
		e.runStage(subjects.Route, nil, 2, 0)
	}
	registerTools(t, n, `{"id":"test.limited","name":"limited","version":"1.0.0","description":"ten an hour","kind":"builtin",
	  "builtin":{"function":"noop"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "rate_limit":{"requests":10,"per_seconds":3600}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const tenant, total = "rl", 40
	ids := make([]string, total)
	for i := range ids {
		id, err := e.client.Invoke(ctx, request(tenant, "test.limited", `{}`), clientOpts(""))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	ok, limited := 0, 0
	for _, id := range ids {
		resp, err := e.client.Wait(ctx, tenant, id)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case resp.Status == api.StatusSuccess:
			ok++
		case resp.Error != nil && resp.Error.Code == api.RateLimitExceeded && resp.Error.ECode == api.ERateLimited:
			if !resp.Error.Retryable || resp.Error.Details["retry_after_ms"] == nil {
				t.Fatalf("rate limit error without retry advice: %s", mustJSON(t, resp.Error))
			}
			limited++
		default:
			t.Fatalf("unexpected %+v", resp)
		}
	}
	if ok != 10 || limited != total-10 {
		t.Fatalf("%d ran and %d were limited; want 10 and %d", ok, limited, total-10)
	}
	if got := e.count(subjects.StreamAudit, subjects.AuditEvent(tenant, envelope.SubjectSuffix(api.TypeRateLimited))); got != total-10 {
		t.Fatalf("%d rate_limited audit events, want %d", got, total-10)
	}
	// Another tenant has its own bucket.
	if resp := e.invoke(request("rl2", "test.limited", `{}`)); resp.Status != api.StatusSuccess {
		t.Fatalf("other tenant: %+v", resp)
	}
}

var retryTools = []string{
	`{"id":"test.flaky","name":"flaky","version":"1.0.0","description":"fails twice","kind":"builtin","builtin":{"function":"flaky"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},"safety":{"idempotent":true},
	  "retry_policy":{"max_attempts":3,"base_delay_ms":5,"max_delay_ms":50}}`,
	`{"id":"test.flaky_unsafe","name":"flaky unsafe","version":"1.0.0","description":"fails twice, not idempotent","kind":"builtin",
	  "builtin":{"function":"flaky"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "retry_policy":{"max_attempts":3,"base_delay_ms":5,"max_delay_ms":50}}`,
}

// TestRetries: an idempotent tool is retried by its manifest's policy and
// the attempts are recorded; a tool that is not idempotent is not retried.
func TestRetries(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{})
	registerTools(t, n, retryTools...)
	resp := e.invoke(request("retry", "test.flaky", `{"n":1}`))
	if resp.Status != api.StatusSuccess || resp.ExecutionMetadata.Attempts != 3 {
		t.Fatalf("idempotent flaky tool: %+v attempts %d", resp, resp.ExecutionMetadata.Attempts)
	}
	var rec envelope.AuditRecord
	if err := e.auditOf("retry", 2)[1].DataAs(&rec); err != nil || rec.Metadata == nil || rec.Metadata.Attempts != 3 {
		t.Fatalf("audit record attempts: %+v, %v", rec.Metadata, err)
	}
	resp = e.invoke(request("retry", "test.flaky_unsafe", `{"n":2}`))
	if resp.Status != api.StatusError || resp.Error.Code != api.ExternalAPIError || resp.ExecutionMetadata.Attempts != 1 {
		t.Fatalf("non-idempotent flaky tool: %+v attempts %d", resp, resp.ExecutionMetadata.Attempts)
	}
}

// TestIdempotencyKey: a repeat with the same key returns the first outcome
// without running the tool, whatever its event id (so also after the
// JetStream duplicate window, which only knows message ids); another request
// under the key is idempotency_conflict; so is a repeat while the first runs.
func TestIdempotencyKey(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{})
	registerTools(t, n, retryTools...)
	const tenant = "idem"
	withKey := func(req api.Request, key string) api.Request {
		req.ExecutionOptions = &api.ExecutionOptions{IdempotencyKey: key}
		return req
	}
	// test.flaky_unsafe fails twice per parameters before it succeeds, so a
	// rerun would show: the first call fails, and its replay must fail too.
	first := e.invoke(withKey(request(tenant, "test.flaky_unsafe", `{"k":1}`), "order-1"))
	if first.Status != api.StatusError {
		t.Fatalf("first call: %+v", first)
	}
	again := e.invoke(withKey(request(tenant, "test.flaky_unsafe", `{ "k" : 1 }`), "order-1"))
	if again.InvocationID == first.InvocationID || again.Status != api.StatusError ||
		again.ExecutionMetadata.ReplayedFrom != first.InvocationID || again.ExecutionMetadata.Attempts != 0 {
		t.Fatalf("replay: %+v (metadata %+v)", again, again.ExecutionMetadata)
	}
	ok := e.invoke(withKey(request(tenant, "echo", `{"message":"m"}`), "order-2"))
	replay := e.invoke(withKey(request(tenant, "echo", `{"message":"m"}`), "order-2"))
	if replay.Status != api.StatusSuccess || string(replay.Result) != string(ok.Result) || replay.ExecutionMetadata.ReplayedFrom != ok.InvocationID {
		t.Fatalf("successful replay: %+v", replay)
	}
	conflict := e.invoke(withKey(request(tenant, "echo", `{"message":"other"}`), "order-2"))
	if conflict.Error == nil || conflict.Error.Code != api.IdempotencyConflict || conflict.Error.ECode != api.EIdempotencyMismatch {
		t.Fatalf("different request under a used key: %+v", conflict)
	}
	// While the first still runs, a repeat is told so, retryably.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	blockID, err := e.client.Invoke(ctx, withKey(request(tenant, "test.block", `{}`), "order-3"), clientOpts(""))
	if err != nil {
		t.Fatal(err)
	}
	<-e.started
	busy := e.invoke(withKey(request(tenant, "test.block", `{}`), "order-3"))
	if busy.Error == nil || busy.Error.ECode != api.EIdempotencyInFlight || !busy.Error.Retryable {
		t.Fatalf("repeat while running: %+v", busy)
	}
	e.release()
	if resp, err := e.client.Wait(ctx, tenant, blockID); err != nil || resp.Status != api.StatusSuccess || e.blocks.Load() != 1 {
		t.Fatalf("first blocked call: %+v, %v, ran %d times", resp, err, e.blocks.Load())
	}
}

// TestAsyncAndCancel: async_mode answers at once with pending and where to
// poll; cancel ends a running tool (its context cancelled), a queued
// invocation before it runs, and a parked one, each exactly once as
// cancelled; an ended invocation keeps its status.
func TestAsyncAndCancel(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{})
	registerTools(t, n, riskyTools...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const tenant = "can"

	// Async: the first message on the result subject is the pending answer.
	areq := request(tenant, "echo", `{"message":"later"}`)
	areq.ExecutionOptions = &api.ExecutionOptions{AsyncMode: true}
	aid, err := e.client.Invoke(ctx, areq, clientOpts(""))
	if err != nil {
		t.Fatal(err)
	}
	msgs := e.read(subjects.StreamResults, subjects.ResultAnyAgent(tenant, aid), 2, 30*time.Second)
	var head struct {
		Type string       `json:"type"`
		Data api.Response `json:"data"`
	}
	if err := json.Unmarshal(msgs[0].Data(), &head); err != nil || head.Type != api.TypeAccepted ||
		head.Data.Status != api.StatusPending || head.Data.PollingInfo == nil || head.Data.PollingInfo.StatusSubject != subjects.TenantSvc(tenant, subjects.SvcStatus) {
		t.Fatalf("async answer %s, %v", msgs[0].Data(), err)
	}
	if resp, err := e.client.Wait(ctx, tenant, aid); err != nil || resp.Status != api.StatusSuccess {
		t.Fatalf("async result: %+v, %v", resp, err)
	}

	// Running: block holds until cancelled.
	rid, err := e.client.Invoke(ctx, request(tenant, "test.block", `{}`), clientOpts(""))
	if err != nil {
		t.Fatal(err)
	}
	<-e.started
	if _, err := e.client.Cancel(ctx, tenant, rid, "changed my mind"); err != nil {
		t.Fatal(err)
	}
	resp, err := e.client.Wait(ctx, tenant, rid)
	if err != nil || resp.Status != api.StatusCancelled || resp.Error.ECode != api.ECancelled {
		t.Fatalf("cancelled running call: %+v, %v", resp, err)
	}

	// Parked: cancelled while waiting for approval.
	pid, err := e.client.Invoke(ctx, request(tenant, "test.critical", `{}`), clientOpts(""))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the call to park", func() bool {
		rec, err := e.client.Status(ctx, tenant, pid)
		return err == nil && rec.Status == api.StatusPendingApproval
	})
	if _, err := e.client.Cancel(ctx, tenant, pid, ""); err != nil {
		t.Fatal(err)
	}
	if resp, err := e.client.Wait(ctx, tenant, pid); err != nil || resp.Status != api.StatusCancelled {
		t.Fatalf("cancelled parked call: %+v, %v", resp, err)
	}

	// Ended: a cancel changes nothing.
	rec, err := e.client.Cancel(ctx, tenant, aid, "")
	if err != nil || rec.Status != api.StatusSuccess {
		t.Fatalf("cancel after the end: %+v, %v", rec, err)
	}
	for _, id := range []string{rid, pid, aid} {
		if got := e.count(subjects.StreamResults, subjects.ResultAnyAgent(tenant, id)); got < 1 || got > 2 {
			t.Fatalf("%s has %d result messages", id, got)
		}
	}
	if got := e.count(subjects.StreamAudit, subjects.AuditEvent(tenant, envelope.SubjectSuffix(api.TypeCancelled))); got != 2 {
		t.Fatalf("%d cancelled audit events, want 2", got)
	}
}

// TestCancelQueued: an invocation cancelled while it waits for execute ends
// cancelled there without running.
func TestCancelQueued(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{Stages: allBut(subjects.Execute)})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id, err := e.client.Invoke(ctx, request("q", "test.block", `{}`), clientOpts(""))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the call to queue at execute", func() bool {
		info, err := e.consumerInfo(subjects.Execute)
		return err == nil && info.NumPending == 1
	})
	if _, err := e.client.Cancel(ctx, "q", id, "queued too long"); err != nil {
		t.Fatal(err)
	}
	e.runStage(subjects.Execute, nil, 1, 0)
	resp, err := e.client.Wait(ctx, "q", id)
	if err != nil || resp.Status != api.StatusCancelled || e.blocks.Load() != 0 {
		t.Fatalf("queued cancel: %+v, %v, tool ran %d times", resp, err, e.blocks.Load())
	}
}

// TestResumeFromCheckpoint: an execute worker dies mid-run; the invocation
// is redelivered to a second worker, which resumes after the last
// checkpoint: the steps before it are not redone and progress continues.
func TestResumeFromCheckpoint(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{AckWait: time.Second})
	e.startPipeline(node.Config{Stages: allBut(subjects.Execute)})
	doomed := e.runStage(subjects.Execute, nil, 1, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const tenant = "ckpt"
	id, err := e.client.Invoke(ctx, request(tenant, "test.steps", `{"n":8,"delay_ms":150}`), clientOpts(""))
	if err != nil {
		t.Fatal(err)
	}
	for step := range e.stepped {
		if step == 2 {
			break
		}
	}
	rec, err := e.client.Status(ctx, tenant, id)
	if err != nil || rec.Status != api.StatusRunning || rec.Checkpoint == nil || rec.Checkpoint.Seq < 3 {
		t.Fatalf("status mid-run: %+v, %v", rec, err)
	}
	doomed.Close() // the worker dies: no ack, no more checkpoints from it
	e.runStage(subjects.Execute, nil, 1, 0)

	resp, err := e.client.Wait(ctx, tenant, id)
	if err != nil || resp.Status != api.StatusSuccess {
		t.Fatalf("resumed call: %+v, %v", resp, err)
	}
	var out struct {
		StartedAt int `json:"started_at"`
	}
	if err := json.Unmarshal(resp.Result, &out); err != nil || out.StartedAt < 3 || resp.ExecutionMetadata.ResumedFromCheckpoint < 3 {
		t.Fatalf("did not resume from a checkpoint: %s, metadata %+v", resp.Result, resp.ExecutionMetadata)
	}
	for i := range 8 {
		runs := e.steps[i].Load()
		switch {
		case i < 3 && runs != 1:
			t.Fatalf("step %d ran %d times; steps before the checkpoint must not be redone", i, runs)
		case runs < 1 || runs > 2:
			t.Fatalf("step %d ran %d times", i, runs)
		}
	}
	if got := e.count(subjects.StreamAudit, subjects.AuditEvent(tenant, envelope.SubjectSuffix(api.TypeCheckpointCreated))); got < 8 {
		t.Fatalf("%d checkpoint.created events, want at least 8", got)
	}
}

// TestInterruptedNonIdempotentTool: a tool that is neither idempotent nor
// checkpointed, interrupted mid-run, ends outcome-unknown instead of
// running twice.
func TestInterruptedNonIdempotentTool(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{AckWait: time.Second})
	e.startPipeline(node.Config{Stages: allBut(subjects.Execute)})
	doomed := e.runStage(subjects.Execute, nil, 1, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id, err := e.client.Invoke(ctx, request("unk", "test.block", `{}`), clientOpts(""))
	if err != nil {
		t.Fatal(err)
	}
	<-e.started
	doomed.Close()
	e.runStage(subjects.Execute, nil, 1, 0)
	resp, err := e.client.Wait(ctx, "unk", id)
	e.release() // let the dead worker's call return
	if err != nil || resp.Error == nil || resp.Error.ECode != api.EOutcomeUnknown || e.blocks.Load() != 1 {
		t.Fatalf("interrupted call: %+v, %v, ran %d times", resp, err, e.blocks.Load())
	}
	// The run that started has its tool.invoked, once: announced by the
	// dead worker and carried again by the ending, under one message id.
	if n := e.count(subjects.StreamAudit, subjects.AuditEvent("unk", envelope.SubjectSuffix(api.TypeInvoked))); n != 1 {
		t.Fatalf("%d tool.invoked events for the interrupted run, want 1", n)
	}
}

// TestSharedCircuitBreaker: failures on one execute worker open the breaker;
// a second worker fails calls fast with E3401; after the open wait one trial
// call, taken from the shared state, closes it again. Each transition is
// announced once on the audit stream.
func TestSharedCircuitBreaker(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{Stages: allBut(subjects.Execute)})
	registerTools(t, n, `{"id":"test.fragile","name":"fragile","version":"1.0.0","description":"fails on request","kind":"builtin",
	  "builtin":{"function":"maybe"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "circuit_breaker":{"failure_rate_threshold":50,"sliding_window_size":4,"minimum_calls":4,"wait_duration_seconds":3,"half_open_calls":1}}`)
	first := e.runStage(subjects.Execute, nil, 1, 0)
	const tenant = "cb"
	// Half of a window of four: the breaker opens at the second failure.
	for i := range 2 {
		if resp := e.invoke(request(tenant, "test.fragile", `{"fail":true}`)); resp.Error == nil || resp.Error.ECode != api.EToolFailed {
			t.Fatalf("failing call %d: %+v", i, resp)
		}
	}
	eventually(t, 5*time.Second, "the breaker to open", func() bool {
		st, err := n.Store.Breaker(context.Background(), "test.fragile")
		return err == nil && st.State == kvstore.BreakerOpen
	})
	// The worker announces the transition after it wrote the state: let it
	// finish before it goes.
	opened := subjects.AuditEvent(subjects.SystemTenant, envelope.SubjectSuffix(api.TypeCircuitOpened))
	eventually(t, 5*time.Second, "the opening to be announced", func() bool { return e.count(subjects.StreamAudit, opened) > 0 })
	first.Close() // the worker that saw the failures is gone
	e.runStage(subjects.Execute, nil, 1, 0)
	resp := e.invoke(request(tenant, "test.fragile", `{}`))
	if resp.Error == nil || resp.Error.Code != api.CircuitBreakerOpen || resp.Error.ECode != api.EBreakerOpen || !resp.Error.Retryable {
		t.Fatalf("call on the second worker while open: %+v", resp)
	}
	// After the open wait (3 s, long enough for a loaded machine to start
	// the second worker within it), a trial call closes it.
	eventually(t, 10*time.Second, "the open wait to pass", func() bool {
		st, err := n.Store.Breaker(context.Background(), "test.fragile")
		return err == nil && time.Now().After(st.Since.Add(3*time.Second+100*time.Millisecond))
	})
	if resp := e.invoke(request(tenant, "test.fragile", `{}`)); resp.Status != api.StatusSuccess {
		t.Fatalf("trial call: %+v", resp)
	}
	st, err := n.Store.Breaker(context.Background(), "test.fragile")
	if err != nil || st.State != kvstore.BreakerClosed {
		t.Fatalf("after the trial: %+v, %v", st, err)
	}
	for _, typ := range []string{api.TypeCircuitOpened, api.TypeCircuitHalfOpened, api.TypeCircuitClosed} {
		if got := e.count(subjects.StreamAudit, subjects.AuditEvent(subjects.SystemTenant, envelope.SubjectSuffix(typ))); got != 1 {
			t.Fatalf("%d %s events, want 1", got, typ)
		}
	}
	// An operator forces it open: every worker refuses at once.
	if _, err := breaker.Force(context.Background(), n.Store, nil, "test.fragile", kvstore.BreakerOpen, "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the forced state to reach the worker", func() bool {
		resp := e.invoke(request(tenant, "test.fragile", `{}`))
		return resp.Error != nil && resp.Error.ECode == api.EBreakerOpen
	})
}

// TestPriorityUnderBacklog: with a backlog at execute, high-priority calls
// overtake normal and low ones, and low ones still progress before the
// normal backlog is gone.
func TestPriorityUnderBacklog(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{Stages: allBut(subjects.Execute), Workers: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const tenant = "prio"
	prio := map[string]string{}
	send := func(p string, n int) {
		for range n {
			req := request(tenant, "noop", `{}`)
			req.ExecutionOptions = &api.ExecutionOptions{Priority: p}
			id, err := e.client.Invoke(ctx, req, clientOpts(""))
			if err != nil {
				t.Fatal(err)
			}
			prio[id] = p
		}
	}
	send(subjects.PriorityLow, 20)
	send(subjects.PriorityNormal, 20)
	send(subjects.PriorityHigh, 5)
	eventually(t, 20*time.Second, "the backlog to queue at execute", func() bool {
		total := 0
		for _, in := range subjects.Inputs(subjects.Execute) {
			if info, err := e.consumerInfoOf(in); err == nil {
				total += int(info.NumPending)
			}
		}
		return total == 45
	})
	e.runStage(subjects.Execute, nil, 1, 0)
	var order []string
	for _, m := range e.read(subjects.StreamResults, subjects.ResultTenant(tenant), 45, 60*time.Second) {
		resp, err := client.DecodeResult(m.Data())
		if err != nil || resp.Status != api.StatusSuccess {
			t.Fatalf("result %+v, %v", resp, err)
		}
		order = append(order, prio[resp.InvocationID])
	}
	lastHigh, firstLow, lastNormal := -1, -1, -1
	for i, p := range order {
		switch p {
		case subjects.PriorityHigh:
			lastHigh = i
		case subjects.PriorityLow:
			if firstLow < 0 {
				firstLow = i
			}
		case subjects.PriorityNormal:
			lastNormal = i
		}
	}
	t.Logf("completion order: %v", order)
	// The worker takes the highest-priority message at hand; on a loaded
	// machine a high one may still be on its way from the server while a
	// normal one waits, so a few may finish between them. Behind a
	// backlog of 40 they would finish last.
	if lastHigh > 10 {
		t.Fatalf("the last high-priority call finished %dth of 45, behind the backlog", lastHigh+1)
	}
	if firstLow < 0 || firstLow > lastNormal {
		t.Fatalf("low-priority calls waited for the whole normal backlog (first low at %d, last normal at %d)", firstLow, lastNormal)
	}
}

// TestCancelRunningSubprocess: cancelling a running cli tool kills its whole
// process tree in the sandbox and ends the invocation cancelled.
func TestCancelRunningSubprocess(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{})
	registerTools(t, n, `{"id":"test.cli_sleep","name":"cli sleep","version":"1.0.0","description":"sleeps in the sandbox","kind":"cli",
	  "cli":{"command":["sh","-c","sleep 41 & sleep 42; echo '{}' # cli-cancel-marker"],"stdin":"none"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},"limits":{"timeout_ms":60000}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id, err := e.client.Invoke(ctx, request("sub", "test.cli_sleep", `{}`), clientOpts(""))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the subprocess to start", func() bool { return len(processesWith("cli-cancel-marker")) > 0 })
	if _, err := e.client.Cancel(ctx, "sub", id, ""); err != nil {
		t.Fatal(err)
	}
	resp, err := e.client.Wait(ctx, "sub", id)
	if err != nil || resp.Status != api.StatusCancelled {
		t.Fatalf("cancelled subprocess: %+v, %v", resp, err)
	}
	eventually(t, 5*time.Second, "no process left behind", func() bool { return len(processesWith("cli-cancel-marker")) == 0 })
}

// processesWith lists processes whose command line contains marker.
func processesWith(marker string) []string {
	var out []string
	files, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), marker) {
			out = append(out, f)
		}
	}
	return out
}
