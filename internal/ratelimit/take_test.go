package ratelimit

import (
	"testing"
	"time"

	"github.com/toolgate/toolgate/kvstore"
)

func TestTake(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name        string
		b           kvstore.Bucket
		exists      bool
		rate, burst float64
		want        int
		now         time.Time
		got         int
		wait        time.Duration
		write       bool
		left        float64
	}{
		{name: "new bucket starts full", rate: 10, burst: 5, want: 3, now: t0, got: 3, write: true, left: 2},
		{name: "takes no more than is left", b: kvstore.Bucket{Tokens: 2, At: t0}, exists: true, rate: 10, burst: 5, want: 4, now: t0, got: 2, write: true, left: 0},
		{name: "refills with elapsed time", b: kvstore.Bucket{Tokens: 0, At: t0}, exists: true, rate: 10, burst: 5, want: 1, now: t0.Add(200 * time.Millisecond), got: 1, write: true, left: 1},
		{name: "refill is capped at burst", b: kvstore.Bucket{Tokens: 0, At: t0}, exists: true, rate: 10, burst: 5, want: 9, now: t0.Add(time.Hour), got: 5, write: true, left: 0},
		{name: "empty bucket waits and writes nothing", b: kvstore.Bucket{Tokens: 0.5, At: t0}, exists: true, rate: 10, burst: 5, want: 1, now: t0, wait: 50 * time.Millisecond, left: 0.5},
		{name: "a clock behind refills nothing", b: kvstore.Bucket{Tokens: 0, At: t0}, exists: true, rate: 10, burst: 5, want: 1, now: t0.Add(-time.Second), wait: 100 * time.Millisecond},
		{name: "a new bucket under one token is still stored", rate: 1, burst: 0.5, want: 1, now: t0, wait: 500 * time.Millisecond, write: true, left: 0.5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := c.b
			got, wait, write := take(&b, c.exists, c.rate, c.burst, c.want, c.now)
			if got != c.got || wait != c.wait || write != c.write {
				t.Fatalf("take = %d, %s, write %v; want %d, %s, write %v", got, wait, write, c.got, c.wait, c.write)
			}
			if b.Tokens != c.left {
				t.Fatalf("%v tokens left, want %v", b.Tokens, c.left)
			}
		})
	}
}
