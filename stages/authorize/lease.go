package authorize

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
)

// Budget leases take the compare-and-swap off the path of most calls of a
// budget that caps only calls. The worker that reserves a call reserves a
// few more with it in the same write (a kvstore.Lease in the usage record)
// and gives them to its next calls of that budget without a write. Leased
// calls count against max_calls from the start, so the workers together
// never admit more than the cap. A lease lives LeaseTTL; the write that
// ends it (the next lease, or a timer) takes back the calls not given. A
// worker that dies holding a lease strands them until the lease is stale
// (leaseGrace after its end), when any writer drops it and its calls count
// as made: a budget may end short of its cap, never over it.
//
// Only budgets that cap nothing but calls are leased. Runtime, cost, tokens
// and failures in a row change with every call's end, and a leased call is
// judged on the usage the lease's write read (or this process wrote
// since); their caps need the exact usage at each reservation, which the
// compare-and-swap gives.

// Lease sizes: a write reserves one call for a budget called rarely, twice
// as many as the last write while calls keep coming within two lease
// lifetimes, at most maxLease and at most an eighth of the calls left, but
// at least one (a small budget is reserved call by call, exactly as
// without leases).
const (
	maxLease   = 16
	leaseShare = 8
	// LeaseTTL is how long a worker gives the calls it leased.
	LeaseTTL = 100 * time.Millisecond
	// leaseGrace is how long after its end a lease its holder did not end
	// is dropped by others: more than any clock skew between workers.
	leaseGrace = 2 * time.Second
	// leaseEndTimeout bounds the write that ends a lease.
	leaseEndTimeout = 5 * time.Second
	// leaseMemory is how many admitted ids a process remembers, so that a
	// redelivered call is not given a second leased call.
	leaseMemory = 4096
)

// leasable reports whether calls under b may be admitted from leases.
func leasable(b *token.Budget) bool {
	return b != nil && b.MaxRuntimeMS <= 0 && b.MaxCost <= 0 && b.MaxTokens <= 0 && b.ApprovalAfterFailures <= 0
}

// leases holds this process's leased calls, by tenant and budget key.
type leases struct {
	store Store
	// holder names this process's leases in usage records.
	holder string
	ttl    time.Duration
	now    func() time.Time

	mu sync.Mutex
	m  map[string]*lease
	// admitted remembers the ids given a leased call, oldest first.
	admitted map[string]struct{}
	order    []string
	sweepAt  int
}

type lease struct {
	tenant, key string

	mu sync.Mutex
	// units are the calls leased and not yet given.
	units int64
	// given counts the calls given since the lease's write, which the
	// usage this process remembers does not show as made.
	given int64
	// ids are the invocations given those calls: the write that ends the
	// lease records them as reserved, so that a call re-driven after this
	// process is gone is found charged.
	ids     []string
	expires time.Time
	timer   *time.Timer
	// size is the calls the last write reserved, wrote when it was made:
	// a budget called again within two lease lifetimes gets twice as many
	// next time, one called rarely one at a time (no lease to give back).
	size  int64
	wrote time.Time
}

func newLeases(store Store, now func() time.Time) *leases {
	return &leases{store: store, holder: uuid.NewString(), ttl: LeaseTTL, now: now,
		m: map[string]*lease{}, admitted: map[string]struct{}{}}
}

func (ls *leases) get(tenant, key string) *lease {
	k := tenant + "\x00" + key
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.m[k]
	if l == nil {
		if len(ls.m) >= ls.sweepAt {
			ls.sweepLocked()
		}
		l = &lease{tenant: tenant, key: key}
		ls.m[k] = l
	}
	return l
}

// sweepLocked forgets the leases that ended: one per budget ever used
// would otherwise stay for the life of the process. The next sweep comes
// when the leases have doubled. ls.mu is held.
func (ls *leases) sweepLocked() {
	for k, l := range ls.m {
		if !l.mu.TryLock() {
			continue
		}
		if l.expires.IsZero() {
			delete(ls.m, k)
		}
		l.mu.Unlock()
	}
	ls.sweepAt = max(minSweep, 2*len(ls.m))
}

// minSweep is the fewest leases swept.
const minSweep = 64

// given is how many calls of the budget under key this process gave from
// its lease since the lease's write: the policy adds them to the calls it
// sees made.
func (ls *leases) given(tenant, key string) int64 {
	ls.mu.Lock()
	l := ls.m[tenant+"\x00"+key]
	ls.mu.Unlock()
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.given
}

// seen reports whether id was already given a leased call, and remembers
// it when not.
func (ls *leases) seen(id string) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if _, ok := ls.admitted[id]; ok {
		return true
	}
	ls.admitted[id] = struct{}{}
	ls.order = append(ls.order, id)
	if len(ls.order) > leaseMemory {
		delete(ls.admitted, ls.order[0])
		ls.order = ls.order[1:]
	}
	return false
}

func (ls *leases) forget(id string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	delete(ls.admitted, id)
}

// reserve admits inv under the budget b keyed key: from this process's
// lease when it holds calls, otherwise with a write that returns what is
// left of an expired lease, reserves this call and leases more.
func (ls *leases) reserve(ctx context.Context, inv *envelope.Invocation, b *token.Budget, key string) error {
	if ls.seen(inv.ID) {
		return nil
	}
	l := ls.get(inv.Tenant, key)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := ls.now()
	if l.units > 0 && now.Before(l.expires) {
		l.units--
		l.given++
		l.ids = append(l.ids, inv.ID)
		return nil
	}
	back, ids := l.units, l.ids
	size := int64(1)
	if !l.wrote.IsZero() && now.Sub(l.wrote) < 2*ls.ttl {
		size = min(max(2*l.size, 2), maxLease)
	}
	var more int64
	var wait time.Duration
	var refused error // a refusal that still writes (stale leases dropped)
	_, err := ls.store.UpdateUsage(ctx, inv.Tenant, key, func(u *kvstore.Usage) error {
		more, refused = 0, nil
		if ab := u.Aborted; ab != nil {
			return sessionAborted(*ab)
		}
		if u.HasReserved(inv.ID) {
			return errAlreadyReserved
		}
		u.Limits = limitsOf(b)
		ended := endLease(u, ls.holder, back, ids)
		dropped := u.DropStaleLeases(now.Add(-leaseGrace))
		if b.MaxCalls > 0 && u.Calls >= b.MaxCalls {
			if len(u.Leases) > 0 {
				wait = leaseWait(u.Leases, now)
				return errLeasedElsewhere
			}
			refused = exhausted("the token has made all %d of its calls", b.MaxCalls)
			if ended || dropped {
				return nil // the leases ended are written, the call refused
			}
			return refused
		}
		more = size - 1
		if b.MaxCalls > 0 {
			more = min(max((b.MaxCalls-u.Calls)/leaseShare, 1), size) - 1
		}
		u.Calls += 1 + more
		if more > 0 {
			u.Leases = append(u.Leases, kvstore.Lease{Holder: ls.holder, Calls: more, Until: now.Add(ls.ttl)})
		}
		u.Reserve(inv.ID)
		return nil
	})
	if err == nil && refused != nil {
		l.units, l.expires, l.ids = 0, time.Time{}, nil
		ls.forget(inv.ID)
		return refused
	}
	if err == nil {
		l.size, l.wrote = 1+more, now
		l.units, l.given, l.expires, l.ids = more, 0, time.Time{}, nil
		if more > 0 {
			l.expires = now.Add(ls.ttl)
			ls.schedule(l)
		}
		return nil
	}
	// Nothing was written: the old lease is ended now.
	_ = ls.endLocked(ctx, l)
	var te *api.Error
	switch {
	case errors.Is(err, errAlreadyReserved):
		return nil
	case errors.Is(err, errLeasedElsewhere):
		ls.forget(inv.ID)
		return stages.Transient(err, wait)
	case errors.As(err, &te):
		ls.forget(inv.ID)
		return err
	}
	ls.forget(inv.ID)
	return stages.Transient(err, 0)
}

// errLeasedElsewhere refuses a call for now: the cap is reached only
// counting calls other workers leased, which come back when their leases
// end if unused (see leaseWait).
var errLeasedElsewhere = errors.New("the budget's remaining calls are leased to other workers")

// leaseWait is how long a call refused by errLeasedElsewhere waits before
// it is judged again: until the first of the leases ends (and its holder
// has written that), or, for one past its end whose holder did not end it,
// until it is stale and dropped. One retry then finds the cap's answer,
// whatever the stage's delivery limit.
func leaseWait(leases []kvstore.Lease, now time.Time) time.Duration {
	const margin = 50 * time.Millisecond // the holder's write of the end
	wait := leaseGrace + margin
	for _, l := range leases {
		end := l.Until
		if !now.Before(end) {
			end = end.Add(leaseGrace)
		}
		wait = min(wait, max(end.Sub(now), 0)+margin)
	}
	return wait
}

// schedule ends l once it expires. l.mu is held.
func (ls *leases) schedule(l *lease) {
	if l.timer != nil {
		l.timer.Stop()
	}
	l.timer = time.AfterFunc(ls.ttl, func() {
		ctx, cancel := context.WithTimeout(context.Background(), leaseEndTimeout)
		defer cancel()
		ls.end(ctx, l, false)
	})
}

// end ends l: once it expired, or at once with now.
func (ls *leases) end(ctx context.Context, l *lease, now bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !now && ls.now().Before(l.expires) {
		return nil
	}
	return ls.endLocked(ctx, l)
}

// endLocked removes this process's lease from l's budget, taking back the
// calls it did not give. l.mu is held.
func (ls *leases) endLocked(ctx context.Context, l *lease) error {
	if l.expires.IsZero() {
		return nil // never leased, or ended
	}
	back, ids := l.units, l.ids
	_, err := ls.store.UpdateUsage(ctx, l.tenant, l.key, func(u *kvstore.Usage) error {
		if !endLease(u, ls.holder, back, ids) && len(ids) == 0 {
			return kvstore.ErrUnchanged
		}
		return nil
	})
	if err != nil && !errors.Is(err, kvstore.ErrUnchanged) {
		return err // the lease stays, its calls counted as made once stale
	}
	l.units, l.expires, l.ids = 0, time.Time{}, nil
	return nil
}

// endLease ends holder's lease on u, of which unused calls were not given,
// and records the invocations given the others as reserved, but those
// whose end was charged already. It reports whether u had the lease.
func endLease(u *kvstore.Usage, holder string, unused int64, ids []string) bool {
	for _, id := range ids {
		if !u.Charged(id) {
			u.Reserve(id)
		}
	}
	return u.EndLease(holder, unused)
}

// release returns every lease's unused calls (at shutdown).
func (ls *leases) release(ctx context.Context) error {
	ls.mu.Lock()
	all := make([]*lease, 0, len(ls.m))
	for _, l := range ls.m {
		all = append(all, l)
	}
	ls.mu.Unlock()
	var errs []error
	for _, l := range all {
		l.mu.Lock()
		if l.timer != nil {
			l.timer.Stop()
		}
		l.mu.Unlock()
		errs = append(errs, ls.end(ctx, l, true))
	}
	return errors.Join(errs...)
}
