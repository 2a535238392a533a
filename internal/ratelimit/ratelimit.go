// Package ratelimit enforces token-bucket limits per tenant and tool across
// every worker: the bucket lives in KV and is updated with compare-and-swap.
//
// A KV round trip per call would dominate the cost of a check, so each
// worker leases tokens, about as many as it spends in a lease's lifetime,
// and spends them locally. Leased tokens
// are taken from the shared bucket when leased, so the workers together never
// admit more than the bucket holds plus what it refills; a lease unused
// within its lifetime is dropped (capacity lost, never invented). Holding a
// token for up to a lease lifetime before spending it lets a burst exceed
// the bucket by at most rate × lease lifetime. Both bounds are tested.
package ratelimit

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
)

// Store is the shared bucket state: UpdateBucket applies fn to a bucket with
// compare-and-swap, writing nothing when fn returns kvstore.ErrUnchanged;
// RateBucket reads one.
type Store interface {
	UpdateBucket(ctx context.Context, tenant, tool string, fn func(b *kvstore.Bucket, exists bool) error) (kvstore.Bucket, error)
	RateBucket(ctx context.Context, tenant, tool string) (kvstore.Bucket, error)
}

// Limiter checks calls against their tool's limit.
type Limiter struct {
	store Store
	// MaxLease caps the tokens a worker leases at once.
	MaxLease int
	// LeaseTTL is how long leased tokens may be spent.
	LeaseTTL time.Duration
	// Overrides replace a tool's limit for a tenant: tenant → tool id → limit.
	Overrides map[string]map[string]tools.RateLimit
	// Defaults, when set, are the tenant's defaults: their rate limit
	// bounds each agent's calls of a tool whose manifest declares none.
	Defaults func(tenant string) tools.Defaults
	Now      func() time.Time

	mu     sync.Mutex
	leases map[leaseKey]*lease
	// sweepAt is the number of leases at which the next new one first
	// drops those that expired: one per tenant and tool ever called would
	// otherwise stay for the life of the process.
	sweepAt int
}

// leaseKey names a worker's lease: the tenant and the bucket (Limit). A
// pair, not a joined string, so that finding it makes nothing.
type leaseKey struct{ tenant, bucket string }

// minSweep is the fewest leases a Limiter sweeps.
const minSweep = 64

type lease struct {
	mu      sync.Mutex
	tokens  int
	expires time.Time
	// size is how many tokens the last lease took (leaseSize).
	size int
	// ids are the invocations given tokens of the lease since its write:
	// the bucket's next write records them (kvstore.Bucket.Took).
	ids []string
}

// DefaultMaxLease is the most tokens a worker leases at once by default:
// at a few thousand calls a second of one tool, a lease then lasts about
// its lifetime, and the bucket is written a few times in 1,000 calls.
const DefaultMaxLease = 256

// New returns a Limiter over store with leases of at most maxLease tokens.
func New(store Store, maxLease int) *Limiter {
	return &Limiter{store: store, MaxLease: max(1, maxLease), LeaseTTL: 100 * time.Millisecond,
		Now: time.Now, leases: map[leaseKey]*lease{}}
}

// Whose limit applies to a call (Applies).
const (
	SourceOverride = "tenant_override" // the tenant's override for the tool
	SourceManifest = "manifest"        // the tool's manifest
	SourceDefault  = "default"         // the defaults, where the manifest declares none: per agent
)

// Limit returns the limit that applies to agent's calls of m in tenant, if
// any, and the bucket it counts in: the tenant's override for m, else the
// manifest's, both shared by the tenant's agents; else the tenant's
// default, one bucket per agent.
func (l *Limiter) Limit(tenant, agent string, m *tools.Manifest) (lim tools.RateLimit, bucket string, ok bool) {
	lim, bucket, _, ok = l.limit(tenant, agent, m)
	return lim, bucket, ok
}

// Applies returns the limit that applies to agent's calls of m in tenant,
// if any, and whose it is (Source…): what a refusal names.
func (l *Limiter) Applies(tenant, agent string, m *tools.Manifest) (lim tools.RateLimit, source string, ok bool) {
	lim, _, source, ok = l.limit(tenant, agent, m)
	return lim, source, ok
}

func (l *Limiter) limit(tenant, agent string, m *tools.Manifest) (lim tools.RateLimit, bucket, source string, ok bool) {
	if o, ok := l.Overrides[tenant][m.ID]; ok {
		return o, m.ID, SourceOverride, true
	}
	if m.RateLimit != nil {
		return *m.RateLimit, m.ID, SourceManifest, true
	}
	if l.Defaults == nil {
		return tools.RateLimit{}, "", "", false
	}
	lim, perAgent, ok := m.EffectiveRateLimit(l.Defaults(tenant))
	if !ok || !perAgent {
		return lim, m.ID, SourceManifest, ok
	}
	// The NUL cannot be in a tool id, so an agent's bucket never is
	// another tool's.
	return lim, m.ID + "\x00" + agent, SourceDefault, true
}

// Allow spends one token of the bucket agent's call of m counts in. When
// none is left it returns false and how long until one is expected.
func (l *Limiter) Allow(ctx context.Context, tenant, agent string, m *tools.Manifest) (bool, time.Duration, error) {
	return l.AllowCall(ctx, tenant, agent, m, "", false)
}

// AllowCall is Allow for the invocation id. The bucket remembers the
// invocations it gave tokens, in the write that gives the token or, for a
// token given from a worker's lease, in the bucket's next write. A call
// that may have been given one before (again: a redelivery, or a re-drive
// after the hops were lost) is looked up first, with a read, and given
// none twice.
func (l *Limiter) AllowCall(ctx context.Context, tenant, agent string, m *tools.Manifest, id string, again bool) (bool, time.Duration, error) {
	lim, bucket, ok := l.Limit(tenant, agent, m)
	if !ok {
		return true, 0, nil
	}
	rate := float64(lim.Requests) / float64(max(1, lim.PerSeconds))
	burst := float64(max(lim.Burst, lim.Requests))
	key := leaseKey{tenant, bucket}
	l.mu.Lock()
	ls := l.leases[key]
	if ls == nil {
		if len(l.leases) >= l.sweepAt {
			l.sweepLocked(l.Now())
		}
		ls = &lease{}
		l.leases[key] = ls
	}
	l.mu.Unlock()

	ls.mu.Lock()
	defer ls.mu.Unlock()
	if again && id != "" {
		if slices.Contains(ls.ids, id) {
			return true, 0, nil // given from this worker's lease, not yet written
		}
		b, err := l.store.RateBucket(ctx, tenant, bucket)
		if err != nil {
			return false, 0, err
		}
		if b.HasTaken(id) {
			return true, 0, nil
		}
	}
	now := l.Now()
	if ls.tokens > 0 && now.Before(ls.expires) {
		ls.tokens--
		if id != "" {
			ls.ids = append(ls.ids, id)
		}
		return true, 0, nil
	}
	want := l.leaseSize(ls, rate, now)
	var got int
	var wait time.Duration
	given := ls.ids
	_, err := l.store.UpdateBucket(ctx, tenant, bucket, func(b *kvstore.Bucket, exists bool) error {
		var write bool
		got, wait, write = take(b, exists, rate, burst, want, now)
		for _, g := range given {
			b.Take(g)
		}
		if got > 0 && id != "" {
			b.Take(id)
		}
		if !write && len(given) == 0 {
			return kvstore.ErrUnchanged
		}
		return nil
	})
	if err != nil {
		return false, 0, err
	}
	ls.ids = nil
	if got == 0 {
		ls.tokens = 0
		return false, wait, nil
	}
	ls.tokens, ls.expires, ls.size = got-1, now.Add(l.LeaseTTL), got
	return true, 0, nil
}

// leaseSize is how many tokens to lease next: about what the worker spends
// in a lease's lifetime, so that the bucket is written once or twice a
// lifetime however fast its calls come, and a worker called seldom leases
// one. A lease spent before it expired is followed by one twice its size,
// one that expired by one of what was spent of it; the first is one token.
// Tokens a worker leases and does not spend in time are lost, so never
// more than the bucket refills in a lease's lifetime: a larger lease would
// make a slow bucket (60 a minute) admit well under its limit when calls
// come in a burst. Nor more than MaxLease.
func (l *Limiter) leaseSize(ls *lease, rate float64, now time.Time) int {
	n := ls.size - ls.tokens
	if ls.tokens <= 0 && now.Before(ls.expires) {
		n = 2 * ls.size
	}
	return int(math.Max(1, math.Min(float64(min(n, l.MaxLease)), rate*l.LeaseTTL.Seconds())))
}

// sweepLocked drops the leases that expired by now: their tokens can no
// longer be spent, so forgetting them changes nothing. A lease in use is
// kept; a caller still holding a dropped one spends or refreshes it as
// before, and the next call for its key starts a new one. The next sweep
// comes when the leases have doubled, so sweeping costs O(1) a lease.
// l.mu must be held.
func (l *Limiter) sweepLocked(now time.Time) {
	for k, ls := range l.leases {
		if !ls.mu.TryLock() {
			continue
		}
		if !now.Before(ls.expires) {
			delete(l.leases, k)
		}
		ls.mu.Unlock()
	}
	l.sweepAt = max(minSweep, 2*len(l.leases))
}

// take takes up to want tokens from b, which refills at rate tokens per
// second up to burst; a bucket that does not exist yet starts full. It
// returns how many it took, how long until one is available when it took
// none, and whether b changed and must be written. Clocks of the workers are
// assumed close; a worker whose clock runs behind refills nothing rather
// than too much.
func take(b *kvstore.Bucket, exists bool, rate, burst float64, want int, now time.Time) (got int, wait time.Duration, write bool) {
	if !exists {
		*b = kvstore.Bucket{Tokens: burst, At: now}
	} else if elapsed := now.Sub(b.At).Seconds(); elapsed > 0 {
		b.Tokens = math.Min(burst, b.Tokens+elapsed*rate)
		b.At = now
	}
	got = min(want, int(math.Floor(b.Tokens)))
	if got <= 0 {
		wait = time.Duration((1 - b.Tokens) / rate * float64(time.Second))
		return 0, wait, !exists
	}
	b.Tokens -= float64(got)
	return got, 0, true
}
