package execute

import (
	"context"
	"sync"
	"time"

	"github.com/toolgate/toolgate/stages"
)

// TenantQuota bounds how many calls of one tenant this process runs at once,
// so that a tenant with a deep backlog of slow calls leaves workers to the
// others. A call over the quota goes back to JetStream with a delay (a
// Transient error matching stages.ErrOverQuota) and the worker takes the
// next message, another tenant's as well as this one's.
//
// The delays follow a schedule per tenant: each call put back is due one
// slot after the previous one, a slot being the tenant's average run time
// divided by its quota, so a backlog comes back about as fast as the quota
// lets it run instead of being fetched over and over. A call on its last
// deliveries but one runs over the quota rather than use up the delivery
// limit, so the quota never fails a call.
type TenantQuota struct {
	// Limit is the most calls of one tenant running at once; 0 is no limit.
	Limit int
	// MaxDelay caps one put-back delay; 0 is 30s.
	MaxDelay time.Duration
	// Now is the clock; nil is time.Now.
	Now func() time.Time

	mu      sync.Mutex
	tenants map[string]*tenantLoad
}

type tenantLoad struct {
	inflight int
	avg      time.Duration // moving average of run times
	due      time.Time     // the last slot handed to a call put back
}

// Initial average run time, before a tenant's first call ends.
const quotaFirstGuess = 100 * time.Millisecond

// NewTenantQuota returns a quota of limit calls per tenant.
func NewTenantQuota(limit int) *TenantQuota { return &TenantQuota{Limit: limit} }

func (q *TenantQuota) now() time.Time {
	if q.Now != nil {
		return q.Now()
	}
	return time.Now()
}

// Acquire admits a call of tenant and returns the function that ends it, or
// a Transient error with the delay after which to try again.
func (q *TenantQuota) Acquire(ctx context.Context, tenant string) (release func(), err error) {
	if q == nil || q.Limit <= 0 {
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
	if t == nil {
		t = &tenantLoad{avg: quotaFirstGuess}
		q.tenants[tenant] = t
	}
	now := q.now()
	if t.inflight >= q.Limit && !last {
		return nil, stages.Transient(stages.ErrOverQuota, q.putBack(t, now))
	}
	t.inflight++
	start := now
	return func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		t.inflight--
		t.avg = (3*t.avg + q.now().Sub(start)) / 4
		if t.inflight == 0 && !t.due.After(q.now()) {
			delete(q.tenants, tenant) // idle: forget it
		}
	}, nil
}

// Defer reports, for a call of tenant not yet decoded, whether it would be
// put back, and after which delay: the runner's fetcher asks it, so that a
// tenant's backlog is put back without occupying a worker per message.
func (q *TenantQuota) Defer(tenant string, delivered, limit int) (time.Duration, bool) {
	if q == nil || q.Limit <= 0 || (limit > 0 && delivered >= limit-1) {
		return 0, false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	t := q.tenants[tenant]
	if t == nil || t.inflight < q.Limit {
		return 0, false
	}
	return q.putBack(t, q.now()), true
}

// putBack gives a call of t the next slot of its schedule and returns the
// delay until it.
func (q *TenantQuota) putBack(t *tenantLoad, now time.Time) time.Duration {
	slot := max(t.avg/time.Duration(q.Limit), time.Millisecond)
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
