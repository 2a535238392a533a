package kvstore

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// shadowPolicyKey holds the candidate policy authorize evaluates beside the
// live one (docs/authorization.md), in the policies bucket, which every
// authorize worker watches already.
const shadowPolicyKey = "shadow"

// PushShadowPolicy stores b as the candidate and returns its revision.
func (s *Store) PushShadowPolicy(ctx context.Context, b PolicyBundle) (uint64, error) {
	return s.putBundle(ctx, shadowPolicyKey, b)
}

// ShadowPolicy returns the candidate, or ok false when there is none.
func (s *Store) ShadowPolicy(ctx context.Context) (PolicyBundle, bool, error) {
	return s.bundle(ctx, shadowPolicyKey, "the candidate policy")
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
