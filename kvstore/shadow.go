package kvstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// shadowPolicyKey holds the candidate policy authorize evaluates beside the
// live one (docs/authorization.md), in the policies bucket, which every
// authorize worker watches already.
const shadowPolicyKey = "shadow"

// PushShadowPolicy stores b as the candidate and returns its revision.
func (s *Store) PushShadowPolicy(ctx context.Context, b PolicyBundle) (uint64, error) {
	if b.PushedAt.IsZero() {
		b.PushedAt = time.Now().UTC()
	}
	val, err := json.Marshal(b)
	if err != nil {
		return 0, err
	}
	return s.policies.Put(ctx, shadowPolicyKey, val)
}

// ShadowPolicy returns the candidate, or ok false when there is none.
func (s *Store) ShadowPolicy(ctx context.Context) (PolicyBundle, bool, error) {
	e, err := s.policies.Get(ctx, shadowPolicyKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return PolicyBundle{}, false, nil
	}
	if err != nil {
		return PolicyBundle{}, false, err
	}
	var b PolicyBundle
	if err := json.Unmarshal(e.Value(), &b); err != nil {
		return PolicyBundle{}, false, fmt.Errorf("decoding the candidate policy: %w", err)
	}
	b.Revision = e.Revision()
	return b, true, nil
}

// DropShadowPolicy removes the candidate.
func (s *Store) DropShadowPolicy(ctx context.Context) error {
	err := s.policies.Delete(ctx, shadowPolicyKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	return err
}

// WatchShadowPolicy calls fn with every candidate pushed, the current one
// first, and with ok false when it is dropped.
func (s *Store) WatchShadowPolicy(ctx context.Context, fn func(b PolicyBundle, ok bool, err error)) error {
	return s.watch(ctx, s.policies, func(e jetstream.KeyValueEntry) {
		if e.Key() != shadowPolicyKey {
			return
		}
		if e.Operation() != jetstream.KeyValuePut {
			fn(PolicyBundle{}, false, nil)
			return
		}
		var b PolicyBundle
		err := json.Unmarshal(e.Value(), &b)
		b.Revision = e.Revision()
		fn(b, true, err)
	})
}
