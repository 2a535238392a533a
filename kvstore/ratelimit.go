package kvstore

import (
	"context"
	"fmt"
	"time"
)

// Bucket is one token bucket as stored: the tokens left at time At. How it
// refills is the rate limiter's business; the store only keeps it.
type Bucket struct {
	Tokens float64   `json:"tokens"`
	At     time.Time `json:"at"`
}

// UpdateBucket applies fn to the token bucket of tenant and tool with a
// compare-and-swap (see update: fn may run several times, and returns
// ErrUnchanged to write nothing). exists is false for a bucket never stored.
// It returns the bucket as stored, or as fn left it when unchanged.
func (s *Store) UpdateBucket(ctx context.Context, tenant, tool string, fn func(b *Bucket, exists bool) error) (Bucket, error) {
	b, _, err := update(ctx, s.ratelimits, invocationKey(tenant, tool), fn)
	if err != nil {
		return Bucket{}, fmt.Errorf("rate limit of %s/%s: %w", tenant, tool, err)
	}
	return b, nil
}
