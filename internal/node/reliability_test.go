package node_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// allBut lists every stage but skip, plus the control service.
func allBut(skip string) []string {
	var out []string
	for _, s := range subjects.Stages {
		if s != skip {
			out = append(out, s)
		}
	}
	return append(out, node.Control)
}

// runStage runs one extra Runner of name on its own connection until the
// test ends, and returns its node (close the node's connection to "kill" it).
func (e *env) runStage(name string, st stages.Stage, workers int, timeout time.Duration) *node.Node {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	n, err := node.Open(ctx, e.url, "test-"+name, e.topo, quietLog())
	if err != nil {
		e.t.Fatal(err)
	}
	if st == nil {
		if st, err = n.NewStage(ctx, name, e.sealed(node.StageConfig{Builtins: e.builtins(e.t.TempDir())})); err != nil {
			e.t.Fatal(err)
		}
	}
	r := n.Runner(name, st, workers, nil)
	if timeout > 0 {
		r.Timeout = timeout
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		n.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			e.t.Errorf("%s runner did not stop", name)
		}
	})
	return n
}

// TestWorkerKilledMidFlight: an execute worker's connection dies while an
// idempotent tool runs; another worker picks the invocation up after AckWait,
// runs it again, and it completes exactly once.
func TestWorkerKilledMidFlight(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{AckWait: 2 * time.Second})
	e.startPipeline(node.Config{Stages: allBut(subjects.Execute)})
	doomed := e.runStage(subjects.Execute, nil, 1, 0)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := e.client.Invoke(ctx, request("crash", "test.block_idem", `{}`), clientOpts("crash-1"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.started:
	case <-ctx.Done():
		t.Fatal("the tool never started")
	}
	// An idempotent tool's status says running once it has run a moment.
	eventually(t, 5*time.Second, "status running while the tool runs", func() bool {
		rec, err := e.client.Status(ctx, "crash", id)
		return err == nil && rec.Status == api.StatusRunning
	})
	doomed.Close() // no ack will ever come from this worker
	e.runStage(subjects.Execute, nil, 1, 0)

	resp, err := e.client.Wait(ctx, "crash", id)
	if err != nil || resp.Status != api.StatusSuccess {
		t.Fatalf("response %+v, %v", resp, err)
	}
	e.release() // let the first worker's stuck call return; it must not publish anything
	e.invoke(request("crash", "echo", `{"message":"marker"}`))
	if n := e.count(subjects.StreamResults, subjects.ResultAnyAgent("crash", id)); n != 1 {
		t.Fatalf("%d results, want 1", n)
	}
	if n := e.count(subjects.StreamAudit, subjects.AuditEvent("crash", "tool.succeeded")); n != 2 {
		t.Fatalf("%d terminal audit events, want 2 (the invocation and the marker)", n)
	}
	if e.blocks.Load() != 2 {
		t.Fatalf("the tool ran %d times, want 2 (once on each worker)", e.blocks.Load())
	}
}

// counting wraps a stage and counts its calls.
type counting struct {
	stages.Stage
	n atomic.Int64
}

func (c *counting) Process(ctx context.Context, inv *envelope.Invocation) ([]stages.Output, error) {
	c.n.Add(1)
	return c.Stage.Process(ctx, inv)
}

// TestThreeWorkersShareAStage runs three authorize processes (three
// connections, one durable consumer) and checks they share the load and
// every invocation completes once.
func TestThreeWorkersShareAStage(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{Stages: allBut(subjects.Authorize)})
	var workers []*counting
	for range 3 {
		n, err := node.Open(context.Background(), e.url, "probe", e.topo, quietLog())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Close) // the stage reads budgets and approvals through it
		st, err := n.NewStage(context.Background(), subjects.Authorize, e.sealed(node.StageConfig{Tokens: testVerifier()}))
		if err != nil {
			t.Fatal(err)
		}
		c := &counting{Stage: st}
		workers = append(workers, c)
		e.runStage(subjects.Authorize, c, 1, 0)
	}
	const total = 90
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := make([]string, total)
	for i := range ids {
		id, err := e.client.Invoke(ctx, request("three", "noop", `{}`), clientOpts(""))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	for _, id := range ids {
		if resp, err := e.client.Wait(ctx, "three", id); err != nil || resp.Status != api.StatusSuccess {
			t.Fatalf("%s: %+v, %v", id, resp, err)
		}
	}
	var sum int64
	for i, w := range workers {
		if w.n.Load() == 0 {
			t.Fatalf("worker %d took no invocation", i)
		}
		sum += w.n.Load()
	}
	if sum != total {
		t.Fatalf("authorize ran %d times for %d invocations", sum, total)
	}
	if n := e.count(subjects.StreamResults, subjects.ResultTenant("three")); n != total {
		t.Fatalf("%d results for %d invocations", n, total)
	}
}

type flaky struct{ calls atomic.Int64 }

func (f *flaky) Process(context.Context, *envelope.Invocation) ([]stages.Output, error) {
	f.calls.Add(1)
	return nil, stages.Transient(errors.New("dependency unavailable"), 20*time.Millisecond)
}

// TestTransientFailureEndsAtDeliveryLimit: a stage that keeps failing
// transiently is retried up to MaxDeliver, then the invocation ends with E3901.
func TestTransientFailureEndsAtDeliveryLimit(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{MaxDeliver: 3})
	e.startPipeline(node.Config{Stages: allBut(subjects.Route)})
	f := &flaky{}
	e.runStage(subjects.Route, f, 1, 0)
	resp := e.invoke(request("flaky", "echo", `{"message":"x"}`))
	if resp.Status != api.StatusError || resp.Error.ECode != api.EDeliveryExhausted {
		t.Fatalf("response %+v", resp)
	}
	if f.calls.Load() != 3 {
		t.Fatalf("route called %d times, want 3", f.calls.Load())
	}
}

type hung struct {
	gate  chan struct{}
	calls atomic.Int64
}

func (h *hung) Process(context.Context, *envelope.Invocation) ([]stages.Output, error) {
	h.calls.Add(1)
	<-h.gate // ignores its context: the worst kind of stage
	return nil, nil
}

// TestHungStageEndsThroughAdvisory: a stage that never returns loses its
// message at each AckWait; at the delivery limit JetStream's advisory ends
// the invocation with E3901, and nothing is left in the work queue.
func TestHungStageEndsThroughAdvisory(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{AckWait: time.Second, MaxDeliver: 2})
	e.startPipeline(node.Config{Stages: allBut(subjects.Route)})
	h := &hung{gate: make(chan struct{})}
	e.runStage(subjects.Route, h, 4, 200*time.Millisecond)
	t.Cleanup(func() { close(h.gate) }) // runs before the runner's own cleanup
	resp := e.invoke(request("hung", "echo", `{"message":"x"}`))
	if resp.Status != api.StatusError || resp.Error.ECode != api.EDeliveryExhausted ||
		!strings.Contains(resp.Error.Message, "did not settle") {
		t.Fatalf("response %+v", resp)
	}
	if h.calls.Load() != 2 {
		t.Fatalf("route called %d times, want 2", h.calls.Load())
	}
	eventually(t, 10*time.Second, "the exhausted message to be deleted", func() bool {
		return e.count(subjects.StreamPipeline, subjects.Pipe(subjects.Route, subjects.PriorityNormal, "hung")) == 0
	})
}

// TestDrainOnShutdown: cancelling Run (what SIGTERM does) lets the tool in
// flight finish and hand on; the rest completes when stages run again.
func TestDrainOnShutdown(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- node.Run(ctx, node.Config{NATSURL: e.url, Examples: true, Workers: 1, Log: quietLog(),
			Stage: node.StageConfig{Builtins: e.builtins(t.TempDir()), Tokens: testVerifier()},
			Ready: func(_ string, n *node.Node) {
				if _, err := n.Store.RegisterTool(ctx, []byte(testTools[2]), true); err != nil {
					t.Error(err)
				}
				_ = n.WaitForTool(ctx, "test.block", "1.0.0")
				close(ready)
			}})
	}()
	<-ready
	id, err := e.client.Invoke(context.Background(), request("drain", "test.block", `{}`), clientOpts(""))
	if err != nil {
		t.Fatal(err)
	}
	<-e.started
	cancel()
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-errc:
		t.Fatalf("Run returned while a tool was running: %v", err)
	default:
	}
	e.release()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after draining")
	}
	// Execute finished and handed on before exiting; nothing was redone.
	// The ack travels on the stopped process's connection, so the server
	// may apply it a moment after Run returns.
	eventually(t, 5*time.Second, "execute consumer settled after drain", func() bool {
		info, err := e.consumerInfo(subjects.Execute)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0 && info.NumRedelivered == 0
	})
	e.startPipeline(node.Config{})
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	resp, err := e.client.Wait(wctx, "drain", id)
	if err != nil || resp.Status != api.StatusSuccess || e.blocks.Load() != 1 {
		t.Fatalf("after restart: %+v, %v, tool ran %d times", resp, err, e.blocks.Load())
	}
}

// TestTopologyIsIdempotent: a second process opening the topology neither
// fails nor resets streams, and keeps an operator's changes.
func TestTopologyIsIdempotent(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 { // concurrent first starts race to create everything
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := node.Open(ctx, e.url, "race", e.topo, quietLog())
			if err == nil {
				n.Close()
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.js.Publish(ctx, subjects.AuditEvent("ops", "note"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	s, err := e.js.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxAge = 90 * 24 * time.Hour // an operator's retention choice
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	n, err := node.Open(ctx, e.url, "second", e.topo, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	info, err := s.Info(ctx)
	if err != nil || info.State.Msgs != 1 || info.Config.MaxAge != 90*24*time.Hour {
		t.Fatalf("audit stream after a second start: %+v, %v", info, err)
	}
	// The audit stream is append-only.
	if err := s.Purge(ctx); err == nil {
		t.Fatal("purging the audit stream succeeded")
	}
	if err := s.DeleteMsg(ctx, 1); err == nil {
		t.Fatal("deleting an audit event succeeded")
	}
	var _ jetstream.Stream = s
}
