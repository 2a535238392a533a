package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/subjects"
)

// TestChaosPowerCut SIGKILLs serve as shipped (--sync always, the hops
// between stages in memory) while a burst of calls it acknowledged sits
// in those hops, and starts it again on the same data directory: what the
// memory held is gone with the process, and every call acknowledged must
// still end exactly once, re-driven from its ingest, within 10 s of the
// restart.
func TestChaosPowerCut(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	binaries(t)
	h := newHarness(t, nil, 1)
	s := h.newServe()
	// One execute worker: the burst queues in the hops before it.
	s.sync, s.workers = "always", "1"
	s.start()
	h.urls = []string{s.url()}
	h.opts = []nats.Option{busauth.CredentialsOption(node.CredsPath(s.data, busauth.RoleOperator))}
	op := operatorClient(t, h.conn(), node.CredsPath(s.data, busauth.RoleOperator))
	rctx, rcancel := context.WithTimeout(t.Context(), time.Minute)
	if _, err := op.RegisterTool(rctx, drivenTool(t), true); err != nil {
		t.Fatal(err)
	}
	rcancel()

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	js, err := jetstream.New(h.conn())
	if err != nil {
		t.Fatal(err)
	}
	pipe, err := js.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		t.Fatal(err)
	}
	if got := pipe.CachedInfo().Config.Storage; got != jetstream.MemoryStorage {
		t.Fatalf("serve's %s is on %v storage, want memory", subjects.StreamPipeline, got)
	}
	inHops := func() int {
		info, err := pipe.Info(ctx)
		if err != nil {
			return -1
		}
		return int(info.State.Msgs)
	}

	// The burst: every publish acknowledged, most calls still queued.
	n := 200
	l := h.drive(ctx, n, 32, 2000)
	held := 0
	deadline := time.Now().Add(5 * time.Second)
	for held = inHops(); held <= 0 && time.Now().Before(deadline); held = inHops() {
		time.Sleep(10 * time.Millisecond)
	}
	if held <= 0 {
		t.Fatalf("no call in the hops to lose (%d)", held)
	}
	s.kill()
	restart := time.Now()
	s.start()
	ready := time.Since(restart)
	if left := inHops(); left < 0 {
		t.Fatal("PIPELINE is gone after the restart")
	}

	// Recovery: the first call ended after the restart, and every call.
	js2, err := jetstream.New(h.conn())
	if err != nil {
		t.Fatal(err)
	}
	before, err := h.read(ctx, js2)
	if err != nil {
		t.Fatal(err)
	}
	first, all := time.Duration(0), time.Duration(0)
	for time.Since(restart) < time.Minute {
		o, err := h.read(ctx, js2)
		if err == nil {
			if first == 0 && len(o.resultAt) > len(before.resultAt) {
				first = time.Since(restart)
			}
			if h.allEnded(l, o) {
				all = time.Since(restart)
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	rep := h.verify(l, "power-cut", 1, ready, time.Minute)
	fmt.Printf("chaos power-cut        in_hops_at_kill=%d ready=%v first_ending=%v all_ended=%v\n",
		held, ready.Round(time.Millisecond), first.Round(time.Millisecond), all.Round(time.Millisecond))
	rep.check(t)
	if all == 0 || all > 10*time.Second {
		t.Errorf("the calls in flight at the kill took %v to end after the restart, want at most 10 s", all)
	}
}
