package execute

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/stages/execute/builtin"
	"github.com/toolgate/toolgate/stages/execute/kind"
)

// fakeStore keeps records, idempotency claims and checkpoints in memory,
// with the store's rules for status records: a terminal record is never
// replaced, nor one of another publish.
type fakeStore struct {
	mu          sync.Mutex
	records     map[string]api.Record
	claims      map[string]kvstore.IdempotencyClaim
	checkpoints map[string]fakeCheckpoint // the latest, by invocation
	saved       []fakeCheckpoint          // all, in order
	down        error
	loadOnce    error // LoadCheckpoint's answer the next time, then forgotten
}

func newFakeStore() *fakeStore {
	return &fakeStore{records: map[string]api.Record{}, claims: map[string]kvstore.IdempotencyClaim{},
		checkpoints: map[string]fakeCheckpoint{}}
}

func (f *fakeStore) Status(_ context.Context, _, id string) (api.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down != nil {
		return api.Record{}, f.down
	}
	rec, ok := f.records[id]
	if !ok {
		return api.Record{}, kvstore.ErrNotFound
	}
	return rec, nil
}

func (f *fakeStore) SetStatus(_ context.Context, rec api.Record) (api.Record, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, ok := f.records[rec.InvocationID]
	if ok && (cur.Status.Terminal() || (cur.Seq != 0 && rec.Seq != 0 && cur.Seq != rec.Seq)) {
		return cur, false, nil
	}
	if cur.CancelRequested {
		rec.CancelRequested, rec.CancelSig, rec.CancelBy = true, cur.CancelSig, cur.CancelBy
	}
	f.records[rec.InvocationID] = rec
	return rec, true, nil
}

func (f *fakeStore) ClaimRun(_ context.Context, rec api.Record, fill func(api.Record, *api.Record)) (api.Record, bool, api.Record, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down != nil {
		return api.Record{}, false, api.Record{}, false, f.down
	}
	cur, ok := f.records[rec.InvocationID]
	if ok && (cur.Status.Terminal() || (cur.Seq != 0 && rec.Seq != 0 && cur.Seq != rec.Seq)) {
		return cur, ok, cur, false, nil
	}
	if cur.CancelRequested {
		rec.CancelRequested, rec.CancelSig, rec.CancelBy = true, cur.CancelSig, cur.CancelBy
	}
	if fill != nil {
		fill(cur, &rec)
	}
	f.records[rec.InvocationID] = rec
	return cur, ok, rec, true, nil
}

func (f *fakeStore) UpdateRecord(_ context.Context, _, id string, change func(*api.Record)) (api.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rec := f.records[id]
	change(&rec)
	f.records[id] = rec
	return rec, nil
}

func (f *fakeStore) ClaimIdempotencyKey(_ context.Context, _, key, id, digest string) (kvstore.IdempotencyClaim, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.claims[key]; ok {
		return c, nil
	}
	c := kvstore.IdempotencyClaim{InvocationID: id, Digest: digest}
	f.claims[key] = c
	return c, nil
}

type fakeCheckpoint struct {
	meta  api.Checkpoint
	state json.RawMessage
}

func (f *fakeStore) SaveCheckpoint(_ context.Context, cp api.Checkpoint, state json.RawMessage, _ *kvstore.CheckpointParent) (api.Checkpoint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cp.ID = kvstore.CheckpointID(cp.InvocationID, cp.Seq)
	f.checkpoints[cp.InvocationID] = fakeCheckpoint{cp, state}
	f.saved = append(f.saved, fakeCheckpoint{cp, state})
	return cp, nil
}

func (f *fakeStore) LoadCheckpoint(_ context.Context, _, id string) (api.Checkpoint, json.RawMessage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.loadOnce; err != nil {
		f.loadOnce = nil
		return api.Checkpoint{}, nil, err
	}
	for _, c := range f.checkpoints {
		if c.meta.ID == id {
			return c.meta, c.state, nil
		}
	}
	return api.Checkpoint{}, nil, api.NewError(api.ResumeFailed, api.ECheckpointNotFound, "no checkpoint %s", id)
}

func (f *fakeStore) LatestCheckpoint(_ context.Context, _, inv string) (api.Checkpoint, bool, int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.checkpoints[inv]
	return c.meta, ok, c.meta.Seq, nil
}

func TestExecute(t *testing.T) {
	reg := tools.NewRegistry()
	put := func(id, fn string, idempotent bool, timeoutMS int64) {
		reg.Put(&tools.Manifest{ID: id, Version: "1.0.0", Kind: "builtin", Builtin: &tools.BuiltinConfig{Function: fn},
			Safety: tools.Safety{Idempotent: idempotent}, Limits: tools.Limits{TimeoutMS: timeoutMS}})
	}
	put("echo", "echo", false, 0)
	put("again", "echo", true, 0)
	put("slow", "block", false, 50)
	put("wait", "block", false, 0)
	put("missing", "nope", false, 0)

	var runs atomic.Int32
	started := make(chan struct{}, 1)
	builtins := builtin.Set{
		"echo": func(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
			runs.Add(1)
			if state := kind.ProgressFrom(ctx).Resumed(); state != nil {
				return state, nil
			}
			return params, nil
		},
		"block": func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			runs.Add(1)
			started <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		},
	}

	cases := []struct {
		name       string
		tool       string
		idemKey    string
		store      func(*fakeStore)
		cancel     bool // cancel the run once the tool started
		wantECode  string
		transient  bool
		wantRuns   int32
		wantResult string
		wantStatus api.Status
		// wantInvoked: the run's tool.invoked travels with the call (the
		// tool ended before its announcement was due; no runner here).
		wantInvoked bool
	}{
		{name: "runs the tool", tool: "echo", wantRuns: 1, wantResult: `{"x":1}`, wantStatus: api.StatusRunning, wantInvoked: true},
		{name: "a redelivery of an ended invocation does not run again", tool: "echo",
			store: func(f *fakeStore) {
				f.records["i-1"] = api.Record{InvocationID: "i-1", Status: api.StatusSuccess, Seq: 5,
					Response: &api.Response{Result: json.RawMessage(`{"first":true}`)}}
			}, wantResult: `{"first":true}`, wantStatus: api.StatusSuccess},
		{name: "an id held by another publish is refused", tool: "echo",
			store: func(f *fakeStore) {
				f.records["i-1"] = api.Record{InvocationID: "i-1", Status: api.StatusRunning, Seq: 4}
			},
			wantECode: api.EDuplicateInvocation},
		{name: "a cancel recorded before the claim stops it", tool: "echo",
			store:     func(f *fakeStore) { f.records["i-1"] = api.Record{InvocationID: "i-1", CancelRequested: true} },
			wantECode: api.ECancelled},
		{name: "a cancel while running stops it", tool: "wait", cancel: true, wantRuns: 1, wantECode: api.ECancelled, wantInvoked: true},
		{name: "interrupted and not idempotent: outcome unknown", tool: "echo",
			store: func(f *fakeStore) {
				f.records["i-1"] = api.Record{InvocationID: "i-1", Status: api.StatusRunning, Seq: 5}
			},
			wantECode: api.EOutcomeUnknown, wantInvoked: true},
		{name: "interrupted and idempotent: run again", tool: "again",
			store: func(f *fakeStore) {
				f.records["i-1"] = api.Record{InvocationID: "i-1", Status: api.StatusRunning, Seq: 5}
			},
			wantRuns: 1, wantResult: `{"x":1}`, wantStatus: api.StatusRunning, wantInvoked: true},
		{name: "interrupted with a checkpoint: resumed from it", tool: "echo",
			store: func(f *fakeStore) {
				f.records["i-1"] = api.Record{InvocationID: "i-1", Status: api.StatusRunning, Seq: 5}
				f.checkpoints["i-1"] = fakeCheckpoint{api.Checkpoint{ID: "cp-2-i-1", Seq: 2, ToolID: "echo"}, json.RawMessage(`{"step":2}`)}
			}, wantRuns: 1, wantResult: `{"step":2}`, wantStatus: api.StatusRunning, wantInvoked: true},
		{name: "over its time limit", tool: "slow", wantRuns: 1, wantECode: api.ETimeout, wantInvoked: true},
		{name: "builtin not in this binary", tool: "missing", wantECode: api.EExecutorUnavailable},
		{name: "idempotency key of an ended call replays it", tool: "echo", idemKey: "k",
			store: func(f *fakeStore) {
				f.claims["k"] = kvstore.IdempotencyClaim{InvocationID: "i-0", Digest: requestDigest(mustResolve(t, reg, "echo"), json.RawMessage(`{"x":1}`))}
				f.records["i-0"] = api.Record{InvocationID: "i-0", Status: api.StatusSuccess, Response: &api.Response{Result: json.RawMessage(`{"replayed":1}`)}}
			}, wantResult: `{"replayed":1}`, wantStatus: api.StatusSuccess},
		{name: "idempotency key reused for another request", tool: "echo", idemKey: "k",
			store:     func(f *fakeStore) { f.claims["k"] = kvstore.IdempotencyClaim{InvocationID: "i-0", Digest: "other"} },
			wantECode: api.EIdempotencyMismatch},
		{name: "status store down is transient", tool: "echo", store: func(f *fakeStore) { f.down = errors.New("kv down") }, transient: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			runs.Store(0)
			st := newFakeStore()
			if c.store != nil {
				c.store(st)
			}
			running := NewRunning()
			x := &Executor{reg: reg, builtins: builtins, store: st, running: running}
			req := &api.Request{ToolID: c.tool, Parameters: json.RawMessage(`{"x":1}`)}
			if c.idemKey != "" {
				req.ExecutionOptions = &api.ExecutionOptions{IdempotencyKey: c.idemKey}
			}
			inv := &envelope.Invocation{ID: "i-1", Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: 5},
				Request: req, Route: &envelope.Route{ToolID: c.tool, ToolVersion: "1.0.0", Executor: "builtin"}}
			if c.cancel {
				go func() {
					<-started
					running.Cancel("acme", "i-1")
				}()
			}
			_, err := x.Process(context.Background(), inv)
			if _, transient := stages.IsTransient(err); transient != c.transient {
				t.Fatalf("transient %v, want %v (%v)", transient, c.transient, err)
			}
			if got := runs.Load(); got != c.wantRuns {
				t.Fatalf("tool ran %d times, want %d", got, c.wantRuns)
			}
			if c.transient {
				return
			}
			if carried := len(inv.Invoked) > 0; carried != c.wantInvoked {
				t.Fatalf("tool.invoked carried with the call: %v, want %v", carried, c.wantInvoked)
			}
			if c.wantECode != "" {
				var ae *api.Error
				if !errors.As(err, &ae) || ae.ECode != c.wantECode {
					t.Fatalf("err %v, want %s", err, c.wantECode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(inv.Result) != c.wantResult || inv.Status != c.wantStatus {
				t.Fatalf("result %s status %s, want %s %s", inv.Result, inv.Status, c.wantResult, c.wantStatus)
			}
		})
	}
}

// TestClaimGivenBackBeforeStart: a failure retried before the tool starts
// (here, loading the checkpoint the request resumes from) gives the claim
// back, so the redelivery runs a tool that is not idempotent instead of
// taking it for interrupted (E3023).
func TestClaimGivenBackBeforeStart(t *testing.T) {
	reg := tools.NewRegistry()
	reg.Put(&tools.Manifest{ID: "once", Version: "1.0.0", Kind: "builtin", Builtin: &tools.BuiltinConfig{Function: "once"}})
	var runs atomic.Int32
	builtins := builtin.Set{"once": func(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
		runs.Add(1)
		return kind.ProgressFrom(ctx).Resumed(), nil
	}}
	st := newFakeStore()
	st.records["i-1"] = api.Record{InvocationID: "i-1", Status: api.StatusPending, Seq: 5}
	// The checkpoint of an earlier call, which this one resumes from.
	st.checkpoints["i-0"] = fakeCheckpoint{api.Checkpoint{ID: "cp-3-i-0", InvocationID: "i-0", Seq: 3, ToolID: "once"}, json.RawMessage(`{"step":3}`)}
	st.loadOnce = api.NewError(api.InternalError, api.EInternal, "checkpoint store unreachable").AsRetryable()
	x := &Executor{reg: reg, builtins: builtins, store: st, running: NewRunning()}
	newInv := func() *envelope.Invocation {
		return &envelope.Invocation{ID: "i-1", Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: 5},
			Request: &api.Request{ToolID: "once", Parameters: json.RawMessage(`{}`),
				CheckpointConfig: &api.CheckpointConfig{ResumeFromCheckpointID: "cp-3-i-0"}},
			Route: &envelope.Route{ToolID: "once", ToolVersion: "1.0.0", Executor: "builtin"}}
	}

	_, err := x.Process(context.Background(), newInv())
	if _, retried := stages.IsTransient(err); !retried {
		t.Fatalf("first delivery: %v, want a transient failure", err)
	}
	if got := st.records["i-1"].Status; got != api.StatusPending || runs.Load() != 0 {
		t.Fatalf("after the failure: record %s, tool ran %d times; want the claim given back (pending) and no run", got, runs.Load())
	}

	inv := newInv()
	if _, err := x.Process(stages.WithDelivery(context.Background(), 2, 5), inv); err != nil {
		t.Fatalf("redelivery: %v, want the tool run", err)
	}
	if runs.Load() != 1 || string(inv.Result) != `{"step":3}` {
		t.Fatalf("redelivery: tool ran %d times with result %s; want once, resumed from the checkpoint", runs.Load(), inv.Result)
	}
}

func mustResolve(t *testing.T, reg *tools.Registry, id string) *tools.Manifest {
	t.Helper()
	m, err := reg.Resolve(id, "")
	if err != nil {
		t.Fatal(err)
	}
	return m
}
