package backoff

import (
	"fmt"
	"testing"
	"time"
)

func TestExponential(t *testing.T) {
	const base, ceiling = 100 * time.Millisecond, 5 * time.Second
	cases := []struct {
		n    int
		want time.Duration
	}{
		{0, base}, {1, base}, {2, 200 * time.Millisecond}, {3, 400 * time.Millisecond},
		{6, 3200 * time.Millisecond}, {7, ceiling}, {40, ceiling}, {1 << 20, ceiling},
	}
	for _, c := range cases {
		t.Run(fmt.Sprint("attempt ", c.n), func(t *testing.T) {
			if got := Exponential(c.n, base, ceiling); got != c.want {
				t.Fatalf("Exponential(%d) = %v, want %v", c.n, got, c.want)
			}
		})
	}
	if got := Exponential(64, 10*time.Second, time.Hour); got != time.Hour {
		t.Fatalf("an overflowing delay is %v, want the ceiling", got)
	}
}

func TestFullJitterStaysWithinTheCurve(t *testing.T) {
	const base, ceiling = 250 * time.Millisecond, 30 * time.Second
	for n := 1; n < 40; n++ {
		limit := Exponential(n, base, ceiling)
		seen := map[time.Duration]bool{}
		for range 50 {
			d := FullJitter(n, base, ceiling)
			if d < time.Millisecond || d > limit+time.Millisecond {
				t.Fatalf("FullJitter(%d) = %v, outside (0, %v]", n, d, limit)
			}
			seen[d] = true
		}
		if len(seen) < 2 {
			t.Fatalf("FullJitter(%d) did not vary", n)
		}
	}
}
