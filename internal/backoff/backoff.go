// Package backoff is the one exponential backoff toolgate waits with:
// between redeliveries, start-up retries, tool retries and restarts of
// crashed MCP servers.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Exponential is the delay before attempt n (counting from 1): base, doubling
// with each attempt, capped at ceiling. n below 1 counts as 1.
func Exponential(n int, base, ceiling time.Duration) time.Duration {
	d := base << min(max(n-1, 0), 30)
	if d <= 0 || d > ceiling {
		return ceiling
	}
	return d
}

// FullJitter is Exponential with full jitter: a delay drawn uniformly below
// Exponential(n, base, ceiling), plus a millisecond so it is never zero.
// Jitter keeps workers that failed together from retrying together.
func FullJitter(n int, base, ceiling time.Duration) time.Duration {
	d := Exponential(n, base, ceiling)
	if d <= 0 {
		return time.Millisecond
	}
	return time.Duration(rand.Int64N(int64(d))) + time.Millisecond
}
