package kvstore

import (
	"fmt"
	"testing"
	"time"
)

// The mirror of abort marks holds what the bucket holds: a mark past the
// bucket's TTL is no longer reported, and expired marks are swept as new
// ones arrive, so the mirror does not grow with every session ever aborted.
func TestAbortsFollowTheBucketTTL(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	a := &Aborts{ttl: time.Hour, now: func() time.Time { return now }}
	a.store(budgetKey("acme", "token:old"), Abort{InvocationID: "i-1", At: now.Add(-2 * time.Hour)})
	a.store(budgetKey("acme", "token:new"), Abort{InvocationID: "i-2", At: now.Add(-time.Minute)})
	if _, ok := a.Aborted("acme", "token:old"); ok {
		t.Error("a mark the bucket has expired is still reported")
	}
	if ab, ok := a.Aborted("acme", "token:new"); !ok || ab.InvocationID != "i-2" {
		t.Errorf("a live mark: %+v, %v", ab, ok)
	}
	for i := range 10 * abortSweepEvery {
		a.store(budgetKey("acme", fmt.Sprintf("token:%d", i)), Abort{At: now.Add(-2 * time.Hour)})
	}
	n := 0
	a.m.Range(func(any, any) bool { n++; return true })
	if n > abortSweepEvery+1 {
		t.Fatalf("%d marks held after %d expired ones arrived", n, 10*abortSweepEvery)
	}
	if _, ok := a.Aborted("acme", "token:new"); !ok {
		t.Error("the sweep dropped a live mark")
	}
}
