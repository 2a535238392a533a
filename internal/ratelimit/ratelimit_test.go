package ratelimit_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/ratelimit"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
)

// counting counts the bucket writes a limiter asks for.
type counting struct {
	*kvstore.Store
	updates atomic.Int64
}

func (c *counting) UpdateBucket(ctx context.Context, tenant, tool string, fn func(b *kvstore.Bucket, exists bool) error) (kvstore.Bucket, error) {
	c.updates.Add(1)
	return c.Store.UpdateBucket(ctx, tenant, tool, fn)
}

func openStore(t testing.TB) *kvstore.Store {
	t.Helper()
	_, js := natstest.JetStream(t)
	s, err := kvstore.Open(context.Background(), js, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestLeasedLimitHoldsAcrossWorkers: three limiters (three workers) hammer
// one bucket of 100 tokens refilling at 100/s for a second. Together they
// admit at most burst + rate × (elapsed + lease lifetime), and waste at most
// one lease each per lease lifetime.
func TestLeasedLimitHoldsAcrossWorkers(t *testing.T) {
	store := openStore(t)
	m := &tools.Manifest{ID: "t", RateLimit: &tools.RateLimit{Requests: 100, PerSeconds: 1}}
	const workers = 3
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(time.Second)
	limiters := make([]*ratelimit.Limiter, workers)
	for i := range limiters {
		limiters[i] = ratelimit.New(store, 8)
	}
	for _, l := range limiters {
		for range 4 { // goroutines per worker
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					ok, wait, err := l.Allow(context.Background(), "acme", "", m)
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						admitted.Add(1)
					} else {
						if wait <= 0 {
							t.Error("refused without a retry-after")
						}
						refused.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	ttl := limiters[0].LeaseTTL.Seconds()
	upper := 100 + 100*(elapsed+ttl)
	lower := 100 + 100*elapsed - float64(workers*8)*(elapsed/ttl+1)
	got := float64(admitted.Load())
	t.Logf("admitted %v, refused %d in %.2fs (bounds %.0f..%.0f)", got, refused.Load(), elapsed, lower, upper)
	if got > upper {
		t.Fatalf("admitted %v, more than the bucket allows (%.0f)", got, upper)
	}
	if got < 100 || got < lower {
		t.Fatalf("admitted %v, fewer than the bucket held", got)
	}
	if refused.Load() == 0 {
		t.Fatal("nothing was refused: the limit did not bite")
	}
}

// TestOverridesAndUnlimited: a tenant override replaces the manifest's
// limit; a tool without a limit is never refused.
func TestOverridesAndUnlimited(t *testing.T) {
	store := openStore(t)
	l := ratelimit.New(store, 8)
	m := &tools.Manifest{ID: "t", RateLimit: &tools.RateLimit{Requests: 1000, PerSeconds: 1}}
	l.Overrides = map[string]map[string]tools.RateLimit{"small": {"t": {Requests: 2, PerSeconds: 3600}}}
	n := 0
	for range 10 {
		if ok, _, err := l.Allow(context.Background(), "small", "", m); err != nil {
			t.Fatal(err)
		} else if ok {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("override admitted %d, want 2", n)
	}
	free := &tools.Manifest{ID: "free"}
	for range 50 {
		if ok, _, _ := l.Allow(context.Background(), "small", "", free); !ok {
			t.Fatal("a tool without a limit was refused")
		}
	}
}

// TestLeasesStayBounded: a worker that serves ever new tenants keeps the
// leases of those calling now, not one per tenant it has ever served; a
// lease within its lifetime is never dropped.
func TestLeasesStayBounded(t *testing.T) {
	store := openStore(t)
	l := ratelimit.New(store, 8)
	clock := time.Now()
	l.Now = func() time.Time { return clock }
	m := &tools.Manifest{ID: "t", RateLimit: &tools.RateLimit{Requests: 100, PerSeconds: 1}}
	allow := func(tenant string) {
		t.Helper()
		if ok, _, err := l.Allow(context.Background(), tenant, "", m); err != nil || !ok {
			t.Fatalf("%s: admitted %v, err %v", tenant, ok, err)
		}
	}
	const tenants = 1000
	most := 0
	for i := range tenants {
		allow(fmt.Sprintf("t%d", i))
		most = max(most, ratelimit.Leases(l))
		clock = clock.Add(l.LeaseTTL) // every lease so far has expired
	}
	if most > 2*64 {
		t.Errorf("%d tenants called one after another left up to %d leases, want at most %d", tenants, most, 2*64)
	}
	// Within their lifetime (the clock stands still), none is dropped.
	for i := range tenants {
		allow(fmt.Sprintf("live%d", i))
	}
	if got := ratelimit.Leases(l); got < tenants {
		t.Errorf("%d leases within their lifetime, %d kept", tenants, got)
	}
}

// TestRedrivenCallTakesOneToken: tokens a worker gives from its lease are
// recorded with the bucket's next write, and one given with a write at
// once; another worker (a process started after a crash) asked again for
// any of those calls gives none a second token, and a call never given
// one takes one.
func TestRedrivenCallTakesOneToken(t *testing.T) {
	store := openStore(t)
	// 1000 a second: a worker leases 8 tokens at a time.
	m := &tools.Manifest{ID: "t", RateLimit: &tools.RateLimit{Requests: 1000, PerSeconds: 1}}
	clock := time.Now()
	first := ratelimit.New(store, 8)
	first.Now = func() time.Time { return clock }
	for i := range 9 { // a lease of 8, then a second lease's write
		if i == 8 {
			clock = clock.Add(first.LeaseTTL)
		}
		if ok, _, err := first.AllowCall(context.Background(), "acme", "", m, fmt.Sprintf("inv-%d", i), false); err != nil || !ok {
			t.Fatalf("call %d: %v, %v", i, ok, err)
		}
	}
	tokens := func() float64 {
		b, err := store.UpdateBucket(context.Background(), "acme", "t", func(*kvstore.Bucket, bool) error { return kvstore.ErrUnchanged })
		if err != nil {
			t.Fatal(err)
		}
		return b.Tokens
	}
	left := tokens()
	// Leasing one token at a time, so that the one a new call takes shows.
	again := ratelimit.New(store, 1)
	again.Now = func() time.Time { return clock }
	for i := range 9 {
		if ok, _, err := again.AllowCall(context.Background(), "acme", "", m, fmt.Sprintf("inv-%d", i), true); err != nil || !ok {
			t.Fatalf("re-driven call %d: %v, %v", i, ok, err)
		}
	}
	if got := tokens(); got != left {
		t.Fatalf("re-driven calls took %v tokens, want none", left-got)
	}
	if ok, _, err := again.AllowCall(context.Background(), "acme", "", m, "inv-new", true); err != nil || !ok || tokens() != left-1 {
		t.Fatalf("a call asked again that never had a token: %v, %v; %v left, want %v", ok, err, tokens(), left-1)
	}
}

// TestLeasedTokenAllocatesNothing: a call given a token of the worker's
// lease finds the lease without making its name.
func TestLeasedTokenAllocatesNothing(t *testing.T) {
	l := ratelimit.New(openStore(t), 1000)
	now := time.Now()
	l.Now = func() time.Time { return now } // the lease never expires
	m := &tools.Manifest{ID: "t", RateLimit: &tools.RateLimit{Requests: 1 << 20, PerSeconds: 1}}
	allow := func() {
		if ok, _, err := l.Allow(context.Background(), "acme", "", m); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	for range 1024 { // leases, doubling to 1000 as each is spent
		allow()
	}
	if n := testing.AllocsPerRun(100, allow); n != 0 {
		t.Fatalf("a leased token costs %v allocations", n)
	}
}

// TestLeaseFollowsDemand: a worker called often leases many tokens at a
// time, so that few calls touch the bucket; one called seldom leases one,
// so that a bucket shared with others loses next to nothing to its
// expired leases.
func TestLeaseFollowsDemand(t *testing.T) {
	store := &counting{Store: openStore(t)}
	l := ratelimit.New(store, ratelimit.DefaultMaxLease)
	clock := time.Now()
	l.Now = func() time.Time { return clock }
	// 10,000 a second, burst 10,000: a lifetime refills 1,000.
	m := &tools.Manifest{ID: "t", RateLimit: &tools.RateLimit{Requests: 10_000, PerSeconds: 1}}
	allow := func(i int) {
		t.Helper()
		if ok, _, err := l.AllowCall(context.Background(), "acme", "", m, fmt.Sprintf("inv-%d", i), false); err != nil || !ok {
			t.Fatalf("call %d: %v, %v", i, ok, err)
		}
	}
	// 2,000 calls a lifetime for half a second.
	const busy = 10_000
	for i := range busy {
		allow(i)
		clock = clock.Add(l.LeaseTTL / 2000)
	}
	if w := store.updates.Load(); w > busy/100 {
		t.Errorf("%d calls in quick succession wrote the bucket %d times, want at most %d", busy, w, busy/100)
	}
	// Then one call in two lifetimes: each leases one token and spends
	// it. Two lifetimes refill the bucket whole, so after the last call it
	// holds all but that call's lease.
	clock = clock.Add(time.Second)
	for i := range 20 {
		allow(busy + i)
		clock = clock.Add(2 * l.LeaseTTL)
	}
	b, err := store.RateBucket(context.Background(), "acme", "t")
	if err != nil {
		t.Fatal(err)
	}
	if leased := 10_000 - b.Tokens; leased != 1 {
		t.Errorf("a worker called once in two lease lifetimes leased %v tokens, want 1", leased)
	}
}
