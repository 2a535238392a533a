package ratelimit_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/ratelimit"
	"github.com/toolgate/toolgate/internal/tools"
)

// BenchmarkAllowCall is route's check of a fast bucket (the shipped
// tools' million a second) as serve makes it at saturation: one process's
// limiter, each call with its id, 1,300 calls a second (the clock moves
// 770 µs a call), the server included; writes/op is the share of calls
// that touch the bucket.
func BenchmarkAllowCall(b *testing.B) {
	store := &counting{Store: openStore(b)}
	l := ratelimit.New(store, ratelimit.DefaultMaxLease)
	m := &tools.Manifest{ID: "echo", RateLimit: &tools.RateLimit{Requests: 1_000_000, PerSeconds: 1, Burst: 1_000_000}}
	clock := time.Now()
	l.Now = func() time.Time { return clock }
	ctx := context.Background()
	ids := make([]string, 4096)
	for i := range ids {
		ids[i] = "inv-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if ok, _, err := l.AllowCall(ctx, "acme", "did:agent:a", m, ids[n%len(ids)], false); err != nil || !ok {
			b.Fatal(ok, err)
		}
		n++
		clock = clock.Add(770 * time.Microsecond)
	}
	b.ReportMetric(float64(store.updates.Load())/float64(n), "writes/op")
}
