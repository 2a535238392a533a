package kvstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/subjects"
)

// Bucket is one token bucket as stored: the tokens left at time At. How it
// refills is the rate limiter's business; the store only keeps it.
type Bucket struct {
	Tokens float64   `json:"tokens"`
	At     time.Time `json:"at"`
	// Took are the latest invocations given a token (tags of their ids,
	// as Usage.Reserved), so that a call re-driven after its hops were
	// lost is not given a second.
	Took []string `json:"took,omitempty"`
}

// TookMemory is how many invocations given a token a bucket remembers.
const TookMemory = 256

// HasTaken reports whether the invocation id was given a token of b.
func (b *Bucket) HasTaken(id string) bool { return remembers(b.Took, id) >= 0 }

// Take remembers that the invocation id was given a token of b.
func (b *Bucket) Take(id string) { b.Took = remember(b.Took, id, TookMemory) }

// UpdateBucket applies fn to the token bucket of tenant and tool with a
// compare-and-swap (see update: fn may run several times, and returns
// ErrUnchanged to write nothing). exists is false for a bucket never stored.
// It returns the bucket as stored, or as fn left it when unchanged.
//
// A missing bucket is a full one, so erasing a counter must not make it
// missing: the bucket's stream refuses purges (eraseProof), and a counter
// whose last message is a delete marker is handed to fn as an empty bucket
// as of its deletion, refilling from then at the tool's rate, never at
// once. Each one found is reported to OnCounterErased.
func (s *Store) UpdateBucket(ctx context.Context, tenant, tool string, fn func(b *Bucket, exists bool) error) (Bucket, error) {
	key := invocationKey(tenant, tool)
	var erased *time.Time // looked up once, the first time the key is missing
	b, _, err := update(ctx, s.ratelimits, key, func(b *Bucket, exists bool) error {
		if !exists {
			if erased == nil {
				at, err := s.counterErased(ctx, key)
				if err != nil {
					return err
				}
				erased = &at
				if !at.IsZero() && s.onErased != nil {
					s.onErased(ctx, tenant, tool)
				}
			}
			if !erased.IsZero() {
				*b, exists = Bucket{Tokens: 0, At: *erased}, true
			}
		}
		return fn(b, exists)
	})
	if err != nil {
		return Bucket{}, fmt.Errorf("rate limit of %s/%s: %w", tenant, tool, err)
	}
	return b, nil
}

// RateBucket returns the token bucket of tenant and tool as stored, with
// one read; a bucket never stored (or erased) is the zero Bucket.
func (s *Store) RateBucket(ctx context.Context, tenant, tool string) (Bucket, error) {
	key := invocationKey(tenant, tool)
	e, err := s.ratelimits.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return Bucket{}, nil
	}
	if err != nil {
		return Bucket{}, fmt.Errorf("rate limit of %s/%s: %w", tenant, tool, err)
	}
	var b Bucket
	if err := decodeEntry(s.ratelimits, key, e, &b); err != nil {
		return Bucket{}, fmt.Errorf("rate limit of %s/%s: %w", tenant, tool, err)
	}
	return b, nil
}

// OnCounterErased has f told of each rate-limit counter found deleted
// (UpdateBucket), for the audit trail. Set it before the store is used.
func (s *Store) OnCounterErased(f func(ctx context.Context, tenant, tool string)) { s.onErased = f }

// counterErased returns when key's counter was deleted, or the zero time
// when its last message is not a delete marker (never written, or aged out
// with the bucket's max age, by when any bucket has refilled).
func (s *Store) counterErased(ctx context.Context, key string) (time.Time, error) {
	st, err := s.js.Stream(ctx, subjects.BucketStream(BucketRateLimits))
	if err != nil {
		return time.Time{}, fmt.Errorf("reading rate-limit history: %w", err)
	}
	m, err := st.GetLastMsgForSubject(ctx, "$KV."+BucketRateLimits+"."+key)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("reading rate-limit history: %w", err)
	}
	switch m.Header.Get("KV-Operation") {
	case "DEL", "PURGE":
		return m.Time, nil
	}
	return time.Time{}, nil
}
