package execute

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/toolgate/toolgate/stages"
)

func TestTenantQuota(t *testing.T) {
	now := time.Unix(1000, 0)
	q := &TenantQuota{Limit: 2, Now: func() time.Time { return now }}
	ctx := stages.WithDelivery(context.Background(), 1, 5)

	r1, err := q.Acquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Acquire(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	// A third call of a is put back, later calls further back; b runs.
	var delays []time.Duration
	for range 3 {
		_, err := q.Acquire(ctx, "a")
		d, ok := stages.IsTransient(err)
		if !ok || !errors.Is(err, stages.ErrOverQuota) {
			t.Fatalf("over the quota: %v", err)
		}
		delays = append(delays, d)
	}
	if !(delays[0] < delays[1] && delays[1] < delays[2]) {
		t.Fatalf("put-back delays %v do not follow a schedule", delays)
	}
	if _, err := q.Acquire(ctx, "b"); err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	// On the last delivery but one, a call runs over the quota rather
	// than use up its deliveries.
	if _, err := q.Acquire(stages.WithDelivery(context.Background(), 4, 5), "a"); err != nil {
		t.Fatalf("near the delivery limit: %v", err)
	}
	if got := q.InFlight("a"); got != 3 {
		t.Fatalf("in flight %d, want 3", got)
	}
	// The fetcher's question, before decoding: a is over, b is not, and
	// a call near the delivery limit is never put back.
	if d, ok := q.Defer("a", 1, 5); !ok || d <= 0 {
		t.Fatalf("Defer a: %v %v", d, ok)
	}
	if _, ok := q.Defer("b", 1, 5); ok {
		t.Fatal("Defer b")
	}
	if _, ok := q.Defer("a", 4, 5); ok {
		t.Fatal("Defer a near the delivery limit")
	}
	x := &Executor{Quota: q}
	if _, ok := x.Defer("toolgate.pipe.execute.normal.a", 1, 5); !ok {
		t.Fatal("Executor.Defer did not read the tenant from the subject")
	}
	r1()
	if got := q.InFlight("a"); got != 2 {
		t.Fatalf("in flight after a release %d, want 2", got)
	}
	var off *TenantQuota
	if _, err := off.Acquire(ctx, "a"); err != nil {
		t.Fatal(err)
	}
}
