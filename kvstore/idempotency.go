package kvstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// IdempotencyClaim is what an idempotency key maps to: the invocation that
// first used it and a digest of what it asked for.
type IdempotencyClaim struct {
	InvocationID string    `json:"invocation_id"`
	Digest       string    `json:"request_digest"`
	ClaimedAt    time.Time `json:"claimed_at"`
}

// ClaimIdempotencyKey records that invocation id of tenant uses key, unless
// another invocation did first. It returns the claim that stands: the new
// one, or the earlier one. Keys expire after the bucket's TTL (24 h by
// default), long after the JetStream duplicate window.
func (s *Store) ClaimIdempotencyKey(ctx context.Context, tenant, key, id, digest string) (IdempotencyClaim, error) {
	k := invocationKey(tenant, key)
	c := IdempotencyClaim{InvocationID: id, Digest: digest, ClaimedAt: time.Now().UTC()}
	val, _ := json.Marshal(c)
	_, err := s.idempotency.Create(ctx, k, val)
	if err == nil {
		return c, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return IdempotencyClaim{}, fmt.Errorf("claiming idempotency key: %w", err)
	}
	e, err := s.idempotency.Get(ctx, k)
	if err != nil {
		return IdempotencyClaim{}, fmt.Errorf("reading idempotency key: %w", err)
	}
	var stood IdempotencyClaim
	if err := json.Unmarshal(e.Value(), &stood); err != nil {
		return IdempotencyClaim{}, fmt.Errorf("decoding idempotency key: %w", err)
	}
	return stood, nil
}
