package breaker_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/breaker"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

func openStore(t *testing.T) *kvstore.Store {
	t.Helper()
	_, js := natstest.JetStream(t)
	s, err := kvstore.Open(context.Background(), js, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestHalfOpenProbesAreSharedAcrossWorkers: with two trial calls allowed,
// eight workers asking at once after the open wait get two probes between
// them; the rest fail fast.
func TestHalfOpenProbesAreSharedAcrossWorkers(t *testing.T) {
	store := openStore(t)
	ctx := context.Background()
	m := &tools.Manifest{ID: "probe", CircuitBreaker: &tools.CircuitBreaker{WaitDurationSeconds: 1, HalfOpenCalls: 2}}
	if _, _, err := store.TransitionBreaker(ctx, "probe", func(s *kvstore.BreakerState) bool {
		s.State, s.Since = kvstore.BreakerOpen, time.Now().Add(-2*time.Second)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var probes []*breaker.Call
	refused := 0
	var wg sync.WaitGroup
	for range 8 {
		b := breaker.New(store, nil, nil)
		if err := store.WatchBreakers(ctx, b.Apply); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			call, err := b.Acquire(ctx, m)
			mu.Lock()
			defer mu.Unlock()
			var te *api.Error
			switch {
			case err == nil:
				probes = append(probes, call)
			case errors.As(err, &te) && te.ECode == api.EBreakerOpen:
				refused++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if len(probes) != 2 || refused != 6 {
		t.Fatalf("%d probes, %d refused; want 2 and 6", len(probes), refused)
	}
	for _, p := range probes {
		p.End(ctx, nil, time.Millisecond)
	}
	st, err := store.Breaker(ctx, "probe")
	if err != nil || st.State != kvstore.BreakerClosed {
		t.Fatalf("after two good probes: %+v, %v", st, err)
	}
}

// TestTransitionOutlivesItsWriter: a transition whose writer dies after
// writing the state but before announcing it is announced by the workers
// watching the breaker, once, and leaves the outbox empty; one whose writer
// announces it is not announced again.
func TestTransitionOutlivesItsWriter(t *testing.T) {
	_, js := natstest.JetStream(t)
	ctx := context.Background()
	if err := topology.EnsureTopology(ctx, js, topology.TopologyOptions{}); err != nil {
		t.Fatal(err)
	}
	store, err := kvstore.Open(ctx, js, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	publish := func(ctx context.Context, o stages.Output) error { return runner.Publish(ctx, js, o) }
	for range 3 {
		w := breaker.New(store, publish, nil)
		if err := store.WatchBreakers(ctx, w.Apply); err != nil {
			t.Fatal(err)
		}
	}
	events := func(subject string) []breaker.Transition {
		t.Helper()
		s, err := js.Stream(ctx, subjects.StreamAudit)
		if err != nil {
			t.Fatal(err)
		}
		c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
		if err != nil {
			t.Fatal(err)
		}
		var out []breaker.Transition
		for {
			msg, err := c.Next(jetstream.FetchMaxWait(300 * time.Millisecond))
			if err != nil {
				return out
			}
			var e struct{ Data breaker.Transition }
			if err := json.Unmarshal(msg.Data(), &e); err != nil {
				t.Fatal(err)
			}
			out = append(out, e.Data)
		}
	}
	opened := subjects.AuditEvent(subjects.SystemTenant, "circuit.opened")
	closed := subjects.AuditEvent(subjects.SystemTenant, "circuit.closed")

	// The writer dies between its write and its announcement.
	died := errors.New("the writer died")
	dead := func(context.Context, stages.Output) error { return died }
	if _, err := breaker.Force(ctx, store, dead, "lost", kvstore.BreakerOpen, "ops"); !errors.Is(err, died) {
		t.Fatalf("forcing with a dead publisher: %v", err)
	}
	if st, _ := store.Breaker(ctx, "lost"); st.State != kvstore.BreakerOpen || len(st.Unannounced) != 1 {
		t.Fatalf("after the writer died: %+v, want open with one event in its outbox", st)
	}
	natstest.Eventually(t, 15*time.Second, func() bool {
		st, err := store.Breaker(ctx, "lost")
		return err == nil && len(st.Unannounced) == 0
	}, "the watching workers to announce the lost transition")

	// A writer that lives announces its own transition at once.
	if _, err := breaker.Force(ctx, store, publish, "kept", kvstore.BreakerClosed, "ops"); err != nil {
		t.Fatal(err)
	}
	if st, _ := store.Breaker(ctx, "kept"); len(st.Unannounced) != 0 {
		t.Fatalf("after its writer announced it: %+v, want an empty outbox", st)
	}

	// Past the grace the watchers give a writer, neither is announced again.
	time.Sleep(3 * time.Second)
	if got := events(opened); len(got) != 1 || got[0].Key != "lost" || !got[0].Forced || got[0].By != "ops" {
		t.Fatalf("opened events: %+v, want the lost transition once", got)
	}
	if got := events(closed); len(got) != 1 || got[0].Key != "kept" {
		t.Fatalf("closed events: %+v, want the kept transition once", got)
	}
}

// TestClosedWorkerLeavesOutboxes: a worker whose node is stopping no
// longer announces transitions for others.
func TestClosedWorkerLeavesOutboxes(t *testing.T) {
	store := openStore(t)
	ctx := context.Background()
	var mu sync.Mutex
	published := 0
	w := breaker.New(store, func(context.Context, stages.Output) error {
		mu.Lock()
		defer mu.Unlock()
		published++
		return nil
	}, nil)
	if err := store.WatchBreakers(ctx, w.Apply); err != nil {
		t.Fatal(err)
	}
	w.Close()
	dead := func(context.Context, stages.Output) error { return errors.New("the writer died") }
	if _, err := breaker.Force(ctx, store, dead, "left", kvstore.BreakerOpen, "ops"); err == nil {
		t.Fatal("forcing with a dead publisher succeeded")
	}
	time.Sleep(3 * time.Second)
	mu.Lock()
	defer mu.Unlock()
	if st, _ := store.Breaker(ctx, "left"); published != 0 || len(st.Unannounced) != 1 {
		t.Fatalf("a closed worker published %d events; outbox %+v", published, st.Unannounced)
	}
}
