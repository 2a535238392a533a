package execute

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/toolgate/toolgate/stages"
)

// TestTenantQuotaShares: whether a call runs or is put back, given the calls
// running per tenant. Defer, the fetcher's question before decoding, must
// agree with Acquire.
func TestTenantQuotaShares(t *testing.T) {
	cases := []struct {
		name            string
		capacity, limit int
		running         map[string]int
		tenant          string
		delivered       int
		quick           bool // the tenant asking has had quick calls
		putBack         bool
	}{
		{name: "alone, below capacity", capacity: 4, running: map[string]int{"a": 3}, tenant: "a"},
		{name: "alone, at capacity", capacity: 4, running: map[string]int{"a": 4}, tenant: "a", putBack: true},
		{name: "alone, many slots", capacity: 256, running: map[string]int{"a": 255}, tenant: "a"},
		{name: "newcomer behind a full process starts in the headroom", capacity: 4, running: map[string]int{"a": 4}, tenant: "b"},
		{name: "newcomer below its share while the headroom is used", capacity: 16, running: map[string]int{"a": 16, "c": 2}, tenant: "b"},
		{name: "above its share, process full", capacity: 4, running: map[string]int{"a": 3, "b": 1}, tenant: "a", putBack: true},
		{name: "above its share, capacity to spare", capacity: 4, running: map[string]int{"a": 2, "b": 1}, tenant: "a"},
		{name: "other tenant holds one call: the rest is ours", capacity: 8, running: map[string]int{"a": 6, "b": 1}, tenant: "a"},
		{name: "below its share, process full", capacity: 4, running: map[string]int{"a": 3, "b": 1}, tenant: "b"},
		{name: "three tenants, at a third", capacity: 9, running: map[string]int{"a": 3, "b": 3, "c": 3}, tenant: "c", putBack: true},
		{name: "limit caps the share of a contended tenant", capacity: 8, limit: 2, running: map[string]int{"a": 3, "b": 5}, tenant: "a", putBack: true},
		{name: "without the limit the same call is below its share", capacity: 8, running: map[string]int{"a": 3, "b": 5}, tenant: "a"},
		{name: "limit leaves a tenant alone unbounded", capacity: 8, limit: 2, running: map[string]int{"a": 7}, tenant: "a"},
		{name: "last delivery but one runs regardless", capacity: 4, running: map[string]int{"a": 4}, tenant: "a", delivered: 4},
		{name: "off", capacity: 0, running: map[string]int{"a": 9}, tenant: "a"},
		{name: "alone at capacity, quick calls wait for a worker", capacity: 4, running: map[string]int{"a": 4}, tenant: "a", quick: true},
		{name: "quick calls above their share with another tenant", capacity: 4, running: map[string]int{"a": 3, "b": 1}, tenant: "a", quick: true, putBack: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			q := &TenantQuota{Capacity: c.capacity, Limit: c.limit, Now: func() time.Time { return now }}
			first := stages.WithDelivery(context.Background(), 1, 5)
			acquire := func(tenant string) func() {
				release, err := q.Acquire(first, tenant)
				if err != nil {
					t.Fatalf("setting up %s: %v", tenant, err)
				}
				return release
			}
			// In name order: which tenant filled the process first decides
			// whose calls sit above their share.
			for _, tenant := range slices.Sorted(maps.Keys(c.running)) {
				n := c.running[tenant]
				if n == 0 {
					continue
				}
				acquire(tenant)
				for range 8 {
					if c.quick && tenant == c.tenant {
						acquire(tenant)() // ends at once: its average falls
					}
				}
				for range n - 1 {
					acquire(tenant)
				}
			}
			delivered := max(c.delivered, 1)
			_, deferred := q.Defer(c.tenant, delivered, 5)
			_, err := q.Acquire(stages.WithDelivery(context.Background(), delivered, 5), c.tenant)
			if got := err != nil; got != c.putBack {
				t.Fatalf("put back %v (%v), want %v", got, err, c.putBack)
			}
			if deferred != c.putBack {
				t.Fatalf("Defer put back %v, Acquire %v", deferred, c.putBack)
			}
			if err != nil {
				if _, ok := stages.IsTransient(err); !ok || !errors.Is(err, stages.ErrOverQuota) {
					t.Fatalf("put back with %v, want a Transient ErrOverQuota", err)
				}
			}
		})
	}
}

// TestTenantQuotaSchedule: calls put back are due one after another, and
// capacity freed goes to the tenant below its share.
func TestTenantQuotaSchedule(t *testing.T) {
	now := time.Unix(1000, 0)
	q := &TenantQuota{Capacity: 4, Now: func() time.Time { return now }}
	ctx := stages.WithDelivery(context.Background(), 1, 5)
	if got := q.Slots(); got != 5 {
		t.Fatalf("slots %d, want 5 (capacity and one of headroom)", got)
	}
	r1, err := q.Acquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := q.Acquire(ctx, "a"); err != nil {
			t.Fatal(err)
		}
	}
	var delays []time.Duration
	for range 3 {
		_, err := q.Acquire(ctx, "a")
		d, ok := stages.IsTransient(err)
		if !ok {
			t.Fatalf("alone at capacity: %v", err)
		}
		delays = append(delays, d)
	}
	if !(delays[0] < delays[1] && delays[1] < delays[2]) {
		t.Fatalf("put-back delays %v do not follow a schedule", delays)
	}
	if _, err := q.Acquire(ctx, "b"); err != nil {
		t.Fatalf("newcomer: %v", err)
	}
	// a's call ends: a is now above its share (3 of 4, its share 2) and
	// the process full, so its next call waits; b, below its share, does not.
	now = now.Add(time.Second)
	r1()
	if _, ok := q.Defer("a", 1, 5); !ok {
		t.Fatal("a above its share in a full process was not put back")
	}
	if _, ok := q.Defer("b", 1, 5); ok {
		t.Fatal("b below its share was put back")
	}
	if got := q.InFlight("a"); got != 3 {
		t.Fatalf("a in flight %d, want 3", got)
	}
	x := &Executor{Quota: q}
	if _, ok := x.Defer("toolgate.pipe.execute.normal.a", 1, 5); !ok {
		t.Fatal("Executor.Defer did not read the tenant from the subject")
	}
	var off *TenantQuota
	if _, err := off.Acquire(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if off.Slots() != 0 {
		t.Fatal("a nil quota has slots")
	}
}
