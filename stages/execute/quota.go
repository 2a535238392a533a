package execute

import (
	"context"
	"sync"
	"time"

	"github.com/toolgate/toolgate/stages"
)

// TenantQuota shares an execute process's calls between tenants without
// leaving any idle. It judges against actual contention, the tenants with
// calls running:
//
//   - a tenant's share is Capacity divided by the tenants running calls,
//     itself included (at most Limit when others run calls, if set), so a
//     tenant alone may use all of Capacity;
//   - a call of a tenant below its share always runs, in the Headroom above
//     Capacity when the process is full, so a tenant that arrives behind
//     another's backlog starts at once, however long the running calls take;
//   - a call of a tenant at or above its share runs only while fewer than
//     Capacity calls run, so capacity no one else uses is never held back,
//     and every call that ends while others wait goes to a tenant below its
//     share;
//   - except that a tenant alone whose calls are quick (under 50 ms on
//     average) is never put back: its calls wait in the process for a
//     worker, as without the quota, since one frees sooner than a put-back
//     would come back.
//
// A call put back goes to JetStream with a delay (a Transient error matching
// stages.ErrOverQuota) and the worker takes the next message. The delays
// follow a schedule per tenant: each call put back is due one slot after
// the previous one, a slot being the tenant's average run time divided by
// its share, so a backlog comes back about as fast as it can run instead of
// being fetched over and over. A call on its last deliveries but one runs
// regardless rather than use up the delivery limit: the quota never fails a
// call.
type TenantQuota struct {
	// Capacity is the calls the process runs for tenants at or above their
	// share; 0 turns the quota off. The Runner has Slots workers.
	Capacity int
	// Limit, when positive, caps a tenant's share while other tenants run
	// calls; 0 is an equal share of Capacity.
	Limit int
	// MaxDelay caps one put-back delay; 0 is 30s.
	MaxDelay time.Duration
	// Now is the clock; nil is time.Now.
	Now func() time.Time

	mu      sync.Mutex
	tenants map[string]*tenantLoad
	running int // calls running, all tenants
	active  int // tenants with calls running
}

type tenantLoad struct {
	inflight int
	avg      time.Duration // moving average of run times
	due      time.Time     // the last slot handed to a call put back
}

// Initial average run time, before a tenant's first call ends.
const quotaFirstGuess = 100 * time.Millisecond

// NewTenantQuota returns a quota sharing capacity calls, with each tenant's
// share capped at limit while others run calls (0: an equal share).
func NewTenantQuota(capacity, limit int) *TenantQuota {
	return &TenantQuota{Capacity: capacity, Limit: limit}
}

// Headroom is how many calls above capacity may run for tenants below their
// share: an eighth, at least one. Enough that newcomers start at once; few
// enough that the process stays near capacity.
func Headroom(capacity int) int { return max(1, capacity/8) }

// Slots is the most calls the process runs at once, the Runner's workers:
// Capacity and its Headroom (Capacity alone with the quota off).
func (q *TenantQuota) Slots() int {
	if q == nil || q.Capacity <= 0 {
		return 0
	}
	return q.Capacity + Headroom(q.Capacity)
}

func (q *TenantQuota) now() time.Time {
	if q.Now != nil {
		return q.Now()
	}
	return time.Now()
}

// off reports whether the quota admits everything.
func (q *TenantQuota) off() bool { return q == nil || q.Capacity <= 0 }

// share is the calls tenant t may run while the process is full.
func (q *TenantQuota) share(t *tenantLoad) int {
	n := q.active
	if t == nil || t.inflight == 0 {
		n++ // the tenant asking counts, running or not
	}
	s := q.Capacity / n
	if n > 1 && q.Limit > 0 {
		s = min(s, q.Limit)
	}
	return max(s, 1)
}

// quickCall is the average run time below which a tenant alone is never put
// back: its call waits in the process for a worker, which frees sooner
// than a put-back would come back, and a newcomer waits no longer than that
// for one either.
const quickCall = 50 * time.Millisecond

// over reports whether a call of t is put back: t is at or above its share
// and the process has no capacity to spare. Callers hold mu.
func (q *TenantQuota) over(t *tenantLoad) bool {
	if t == nil || t.inflight < q.share(t) || q.running < q.Capacity {
		return false // nothing running, below its share, or room to spare
	}
	return q.active > 1 || t.avg >= quickCall
}

// Acquire admits a call of tenant and returns the function that ends it, or
// a Transient error with the delay after which to try again.
func (q *TenantQuota) Acquire(ctx context.Context, tenant string) (release func(), err error) {
	if q.off() {
		return func() {}, nil
	}
	delivered, limit := stages.Delivery(ctx)
	last := limit > 0 && delivered >= limit-1
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.tenants == nil {
		q.tenants = map[string]*tenantLoad{}
	}
	t := q.tenants[tenant]
	now := q.now()
	if q.over(t) && !last {
		return nil, stages.Transient(stages.ErrOverQuota, q.putBack(t, now))
	}
	if t == nil {
		t = &tenantLoad{avg: quotaFirstGuess}
		q.tenants[tenant] = t
	}
	if t.inflight == 0 {
		q.active++
	}
	t.inflight++
	q.running++
	start := now
	return func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		end := q.now()
		t.inflight--
		q.running--
		t.avg = (3*t.avg + end.Sub(start)) / 4
		if t.inflight == 0 {
			q.active--
			if !t.due.After(end) {
				delete(q.tenants, tenant) // idle: forget it
			}
		}
	}, nil
}

// Defer reports, for a call of tenant not yet decoded, whether it would be
// put back, and after which delay: the runner's fetcher asks it, so that a
// tenant's backlog is put back without occupying a worker per message.
func (q *TenantQuota) Defer(tenant string, delivered, limit int) (time.Duration, bool) {
	if q.off() || (limit > 0 && delivered >= limit-1) {
		return 0, false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	t := q.tenants[tenant]
	if !q.over(t) {
		return 0, false
	}
	return q.putBack(t, q.now()), true
}

// putBack gives a call of t the next slot of its schedule and returns the
// delay until it.
func (q *TenantQuota) putBack(t *tenantLoad, now time.Time) time.Duration {
	slot := max(t.avg/time.Duration(q.share(t)), time.Millisecond)
	t.due = later(t.due, now).Add(slot)
	return max(min(t.due.Sub(now), q.maxDelay()), 2*time.Millisecond)
}

// InFlight returns how many calls of tenant are running.
func (q *TenantQuota) InFlight(tenant string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if t := q.tenants[tenant]; t != nil {
		return t.inflight
	}
	return 0
}

func (q *TenantQuota) maxDelay() time.Duration {
	if q.MaxDelay > 0 {
		return q.MaxDelay
	}
	return 30 * time.Second
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
