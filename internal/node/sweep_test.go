package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// TestPassedOverMessageEndsWithoutItsAdvisory: route's message reaches the
// delivery limit (each delivery went to a worker that died holding it), and
// the process that took JetStream's one advisory dies before acting on it.
// Two route processes started afterwards find the message in their sweeps
// (still in the stream, nothing pending) and end it: the invocation gets
// exactly one result, one terminal audit event and an E3901 status, and the
// message is gone.
func TestPassedOverMessageEndsWithoutItsAdvisory(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{AckWait: time.Second, MaxDeliver: 2})
	e.startPipeline(node.Config{Stages: allBut(subjects.Route)})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const tenant = "swept"
	id, err := e.client.Invoke(ctx, request(tenant, "echo", `{"message":"x"}`), client.InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// The route process that takes JetStream's one advisory dies before it
	// acts on it.
	in := subjects.InputOf(subjects.Route)
	holder := e.connect()
	advisories, err := holder.QueueSubscribeSync(subjects.MaxDeliveriesAdvisory(in), "toolgate-"+subjects.Route)
	if err != nil {
		t.Fatal(err)
	}
	// The workers that die holding the message: two deliveries, no
	// settlement; a third pull finds the delivery limit reached.
	cons, err := e.js.Consumer(ctx, in.Stream, in.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	deliveries := 0
	for {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for range batch.Messages() {
			deliveries++
		}
		if _, err := advisories.NextMsg(10 * time.Millisecond); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no advisory after %d deliveries", deliveries)
		}
	}
	holder.Close()
	if deliveries != 2 {
		t.Fatalf("%d deliveries, want 2", deliveries)
	}
	if n := e.count(subjects.StreamPipeline, subjects.Pipe(subjects.Route, subjects.PriorityNormal, tenant)); n != 1 {
		t.Fatalf("%d route messages in the stream, want the exhausted one", n)
	}

	// Two route processes, each sweeping often.
	for range 2 {
		n, err := node.Open(ctx, e.url, "test-route", e.topo, quietLog())
		if err != nil {
			t.Fatal(err)
		}
		st, err := n.NewStage(ctx, subjects.Route, e.sealed(node.StageConfig{Builtins: e.builtins(t.TempDir())}))
		if err != nil {
			t.Fatal(err)
		}
		r := n.Runner(subjects.Route, st, 1, nil)
		r.SweepEvery = 100 * time.Millisecond
		rctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(rctx) }()
		t.Cleanup(func() { stop(); <-done; n.Close() })
	}

	resp, err := e.client.Wait(ctx, tenant, id)
	if err != nil {
		t.Fatalf("the passed-over invocation never ended: %v", err)
	}
	if resp.Status != api.StatusError || resp.Error == nil || resp.Error.ECode != api.EDeliveryExhausted {
		t.Fatalf("response %+v", resp)
	}
	eventually(t, 10*time.Second, "the exhausted message to be deleted", func() bool {
		return e.count(subjects.StreamPipeline, subjects.Pipe(subjects.Route, subjects.PriorityNormal, tenant)) == 0
	})
	// Audit has taken every hand-off there is; the sweeps that ran since
	// found nothing more to end.
	eventually(t, 10*time.Second, "audit to take every hand-off", func() bool {
		info, err := e.consumerInfo(subjects.Audit)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	if n := e.count(subjects.StreamResults, subjects.ResultAnyAgent(tenant, id)); n != 1 {
		t.Fatalf("%d results, want 1", n)
	}
	terminals := 0
	for _, ev := range e.auditOf(tenant, e.count(subjects.StreamAudit, subjects.AuditTenant(tenant))) {
		if isTerminal(ev) {
			terminals++
		}
	}
	if terminals != 1 {
		t.Fatalf("%d terminal audit events, want 1", terminals)
	}
	rec, err := e.client.Status(ctx, tenant, id)
	if err != nil || rec.Status != api.StatusError || rec.Error == nil || rec.Error.ECode != api.EDeliveryExhausted {
		t.Fatalf("status record %+v (%v)", rec, err)
	}
}

func isTerminal(ev event.Event) bool {
	switch ev.Type() {
	case api.TypeSucceeded, api.TypeFailed, api.TypeTimeout, api.TypeCancelled,
		api.TypeRejected, api.TypePermissionDenied, api.TypeRateLimited:
		return true
	}
	return false
}
