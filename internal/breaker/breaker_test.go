package breaker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/breaker"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
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
