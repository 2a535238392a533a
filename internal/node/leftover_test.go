package node_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// leftovers is a served toolgate, its bus authenticated with the shipped
// roles, without a route stage: the test puts messages into route's work
// queue and leaves them there (delivered once, never settled, as a worker
// that died holding them, or as acknowledged messages JetStream kept after
// a hard kill look), then runs route with a fast sweep.
type leftovers struct {
	*served
	topo topology.TopologyOptions
	op   jetstream.JetStream
	node *node.Node
}

func newLeftovers(t *testing.T) *leftovers {
	t.Helper()
	dir := t.TempDir()
	topo := topology.TopologyOptions{AckWait: time.Second, MaxDeliver: 1}
	n, url := runServed(t, node.Config{Embedded: node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: dir},
		Stages: allBut(subjects.Route), Topology: topo})
	s := &served{urls: []string{url}, dataDir: dir, node: n}
	op, err := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	if err != nil {
		t.Fatal(err)
	}
	return &leftovers{served: s, topo: topo, op: op, node: n}
}

// leave puts a hand-off to route for each invocation into the pipeline and
// lets route's consumer pass it over.
func (l *leftovers) leave(t *testing.T, invs ...*envelope.Invocation) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// As authorize hands calls to route: signed with its key.
	k, err := busauth.LoadHopKey(l.dataDir, busauth.RoleAuthorize)
	if err != nil {
		t.Fatal(err)
	}
	pubs, err := busauth.LoadHopPublicKeys(l.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	sg := seal.NewMessages(pubs).NewSigner(busauth.RoleAuthorize, k)
	js := seal.SigningJetStream(l.op, sg)
	for _, inv := range invs {
		// With route's custody, which a call authorize handed on carries.
		inv.Custody = sg.Custody(busauth.RoleRoute, inv.Tenant, inv.ID, inv.Event.Seq)
		o, err := runner.Handoff(inv, subjects.Route)
		if err != nil {
			t.Fatal(err)
		}
		if err := runner.Publish(ctx, js, o); err != nil {
			t.Fatal(err)
		}
	}
	in := subjects.InputOf(subjects.Route)
	cons, err := l.op.Consumer(ctx, in.Stream, in.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	for got := 0; got < len(invs); {
		batch, err := cons.Fetch(len(invs)-got, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for range batch.Messages() {
			got++
		}
	}
	eventually(t, 30*time.Second, "route's consumer to pass the messages over", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
}

// startRoute runs a route process connected as role, sweeping every 100 ms,
// and returns its stop function, which reports how long Run took to return.
func (l *leftovers) startRoute(t *testing.T, role busauth.Role, reg prometheus.Registerer, log *slog.Logger) func() time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := node.OpenRole(ctx, l.urls[0], "test-route", role, l.topo, quietLog(), l.creds(role))
	if err != nil {
		t.Fatal(err)
	}
	if role.Stage() {
		if err := n.SignAs(l.dataDir); err != nil {
			t.Fatal(err)
		}
	}
	st, err := n.NewStage(ctx, subjects.Route, node.StageConfig{})
	if err != nil {
		t.Fatal(err)
	}
	r := n.Runner(subjects.Route, st, 1, runner.NewMetrics(reg))
	r.Log = log
	r.SweepEvery = 100 * time.Millisecond
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(rctx) }()
	var once sync.Once
	var took time.Duration
	halt := func() time.Duration {
		once.Do(func() {
			start := time.Now()
			stop()
			<-done
			took = time.Since(start)
			n.Close()
		})
		return took
	}
	t.Cleanup(func() { halt() })
	return halt
}

// inRoute reports whether route's queue holds a message of inv.
func (l *leftovers) inRoute(t *testing.T, inv *envelope.Invocation) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := l.op.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		t.Fatal(err)
	}
	want := runner.HopID(inv, subjects.Route)
	for seq := uint64(1); ; {
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subjects.PipeStage(subjects.Route)))
		if err != nil {
			return false
		}
		if m.Header.Get(jetstream.MsgIDHeader) == want {
			return true
		}
		seq = m.Sequence + 1
	}
}

// auditEvents counts the audit events about tenant.
func (l *leftovers) auditEvents(t *testing.T, tenant string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := l.op.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subjects.AuditTenant(tenant)))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range info.State.Subjects {
		n += int(c)
	}
	return n
}

// counter reads a counter of reg with the given labels.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metrics
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// leftoverCall is an invocation of tenant with a status record in state st
// (none for ""), written as its stages would.
func (l *leftovers) leftoverCall(t *testing.T, tenant, id string, seq uint64, st api.Status) *envelope.Invocation {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	inv := &envelope.Invocation{ID: id, Tenant: tenant, Event: envelope.Event{Seq: seq}, Status: api.StatusPending,
		Request: &api.Request{ToolID: "echo", AgentContext: api.AgentContext{AgentDID: "did:agent:t", TenantID: tenant}}}
	if st == "" {
		return inv
	}
	if _, _, err := l.node.Store.ClaimInvocation(ctx, tenant, id, seq, "d", "", "", ""); err != nil {
		t.Fatal(err)
	}
	if st != api.StatusPending {
		rec := api.Record{InvocationID: id, Tenant: tenant, Status: st, Seq: seq}
		if _, _, err := l.node.Store.SetStatus(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	return inv
}

// TestSweepTellsLeftoversFromStuckCalls: on the authenticated bus, with
// the shipped worker role, route's sweep deletes the messages of calls
// that ended without a trace (no audit event, no result, no hand-off),
// leaves those whose call is parked or running alone until they end, and
// ends only the one whose call is stuck at route: one E3901 ending.
func TestSweepTellsLeftoversFromStuckCalls(t *testing.T) {
	l := newLeftovers(t)
	const tenant = "swept"
	var ended []*envelope.Invocation
	for i := range 20 {
		ended = append(ended, l.leftoverCall(t, tenant, fmt.Sprintf("ended-%d", i), uint64(100+i), api.StatusSuccess))
	}
	parked := l.leftoverCall(t, tenant, "parked", 200, api.StatusPendingApproval)
	running := l.leftoverCall(t, tenant, "running", 201, api.StatusRunning)
	stuck := l.leftoverCall(t, tenant, "stuck", 202, api.StatusPending)
	l.leave(t, append(ended, parked, running, stuck)...)
	before := l.auditEvents(t, tenant)

	reg := prometheus.NewRegistry()
	l.startRoute(t, busauth.RoleRoute, reg, quietLog())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eventually(t, 20*time.Second, "the stuck call to end", func() bool {
		rec, err := l.node.Store.Status(ctx, tenant, stuck.ID)
		return err == nil && rec.Status.Terminal()
	})
	rec, _ := l.node.Store.Status(ctx, tenant, stuck.ID)
	if rec.Status != api.StatusError || rec.Error == nil || rec.Error.ECode != api.EDeliveryExhausted {
		t.Fatalf("stuck call's record %+v", rec)
	}
	eventually(t, 20*time.Second, "the ended calls' messages to be deleted", func() bool {
		for _, inv := range append(ended, stuck) {
			if l.inRoute(t, inv) {
				return false
			}
		}
		return true
	})
	// The parked and running calls were seen by several sweeps since.
	eventually(t, 20*time.Second, "sweeps holding the live calls", func() bool {
		return counter(t, reg, "toolgate_sweep_messages_total", map[string]string{"outcome": "held"}) >= 6
	})
	if !l.inRoute(t, parked) || !l.inRoute(t, running) {
		t.Fatal("a message of a parked or running call was taken")
	}
	for _, inv := range []*envelope.Invocation{parked, running} {
		if rec, err := l.node.Store.Status(ctx, tenant, inv.ID); err != nil || rec.Status.Terminal() {
			t.Fatalf("%s: record %+v (%v)", inv.ID, rec, err)
		}
	}
	// One terminal event (the stuck call's), nothing for the others.
	eventually(t, 10*time.Second, "the stuck call's terminal event", func() bool { return l.auditEvents(t, tenant) > before })
	if got := l.auditEvents(t, tenant) - before; got != 1 {
		t.Fatalf("%d audit events from the sweep, want the stuck call's one", got)
	}
	if got := counter(t, reg, "toolgate_sweep_messages_total", map[string]string{"outcome": "deleted"}); got != float64(len(ended)) {
		t.Fatalf("%v deleted, want %d", got, len(ended))
	}

	// Once the parked call ends (declined, say), its leftover goes.
	if _, _, err := l.node.Store.SetStatus(ctx, api.Record{InvocationID: parked.ID, Tenant: tenant,
		Status: api.StatusPermissionDenied, Seq: parked.Event.Seq}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the ended parked call's message to be deleted", func() bool { return !l.inRoute(t, parked) })
	if !l.inRoute(t, running) {
		t.Fatal("the running call's message was taken")
	}
	if got := counter(t, reg, "toolgate_sweep_delete_failures_total", nil); got != 0 {
		t.Fatalf("%v failed deletes with the route role", got)
	}
}

// TestSweepStopsPromptlyWithRefusedDeletes: a process whose credentials
// cannot delete from the work queue (the stream denies deletes) reports each
// refusal as an error and counts it, and with hundreds of leftovers still
// to go, stops at once when asked.
func TestSweepStopsPromptlyWithRefusedDeletes(t *testing.T) {
	l := newLeftovers(t)
	const tenant = "refused"
	var invs []*envelope.Invocation
	for i := range 300 {
		invs = append(invs, l.leftoverCall(t, tenant, fmt.Sprintf("c-%d", i), uint64(1000+i), api.StatusSuccess))
	}
	l.leave(t, invs...)
	// The operator makes the pipeline refuse deletes: route's sweep may
	// delete there, but now the stream says no to every one.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := l.op.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.DenyDelete = true
	if _, err := l.op.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	stop := l.startRoute(t, busauth.RoleRoute, reg, slog.New(slog.NewTextHandler(&logs, nil)))
	eventually(t, 30*time.Second, "a refused delete to be counted", func() bool {
		return counter(t, reg, "toolgate_sweep_delete_failures_total", map[string]string{"stream": subjects.StreamPipeline}) >= 1
	})
	took := stop()
	t.Logf("stopped in %v with %d leftovers", took, len(invs))
	if took > 3*time.Second {
		t.Fatalf("took %v to stop", took)
	}
	if !strings.Contains(logs.String(), "delet") {
		t.Fatalf("the refused delete was not reported:\n%s", logs.String())
	}
	if !l.inRoute(t, invs[0]) {
		t.Fatal("a refused delete removed the message")
	}
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
