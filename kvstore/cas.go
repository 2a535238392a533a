package kvstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// casAttempts bounds compare-and-swap loops; contention beyond it is an error
// the caller retries later.
const casAttempts = 32

// ErrUnchanged is returned by an update function to leave the stored value
// as it is: the update then returns the value as the function left it, the
// revision read, and no error.
var ErrUnchanged = errors.New("kvstore: value left unchanged")

// ErrContention reports a compare-and-swap that lost to concurrent writers
// casAttempts times in a row.
var ErrContention = errors.New("too much contention")

// update reads key from kv (or, in a bucket that remembers its writes,
// starts from the value this process last wrote: recent.go), decodes it into a T (the zero T with exists false
// when the key is missing), calls fn on it and writes the result back with
// Create (missing key) or Update at the revision read, so a concurrent write
// between read and write is never lost: on a conflict (ErrKeyExists or
// ErrKeyRevisionMismatch) it reads again and calls fn again, up to
// casAttempts times, then returns ErrContention. fn must therefore be
// repeatable and decide only from the value it is given.
//
// If fn returns ErrUnchanged nothing is written and update returns the value
// as fn left it with the revision read (0 for a missing key). Any other
// error from fn is returned as is, with the value as fn left it. On success
// update returns the value written and its new revision.
func update[T any](ctx context.Context, kv jetstream.KeyValue, key string, fn func(v *T, exists bool) error) (T, uint64, error) {
	return updateKey(ctx, kv, key, false, fn)
}

// updateFresh is update for a key that is expected not to exist yet: in a
// bucket that remembers its writes, the first try is fn on the zero value
// written with Create, without a read (recent.go).
func updateFresh[T any](ctx context.Context, kv jetstream.KeyValue, key string, fn func(v *T, exists bool) error) (T, uint64, error) {
	return updateKey(ctx, kv, key, true, fn)
}

func updateKey[T any](ctx context.Context, kv jetstream.KeyValue, key string, fresh bool, fn func(v *T, exists bool) error) (T, uint64, error) {
	var zero T
	recent := recentOf(kv)
	if recent != nil {
		v, rev, err := updateRemembered(ctx, kv, recent, key, fresh, fn)
		if !errors.Is(err, errStale) {
			if err != nil {
				return zero, 0, fmt.Errorf("writing %s: %w", key, err)
			}
			return v, rev, nil
		}
	}
	for range casAttempts {
		var v T
		var rev uint64
		e, err := kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return zero, 0, fmt.Errorf("reading %s: %w", key, err)
		default:
			if err := decodeStored(e.Value(), &v); err != nil {
				return zero, 0, fmt.Errorf("decoding %s: %w", key, err)
			}
			rev = e.Revision()
		}
		if err := fn(&v, rev != 0); errors.Is(err, ErrUnchanged) {
			return v, rev, nil
		} else if err != nil {
			return v, rev, err
		}
		val, err := encodeValue(&v) // not v: boxing would copy it
		if err != nil {
			return zero, 0, err
		}
		var next uint64
		if rev == 0 {
			next, err = kv.Create(ctx, key, val)
		} else {
			next, err = kv.Update(ctx, key, val, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err != nil {
			return zero, 0, fmt.Errorf("writing %s: %w", key, err)
		}
		if recent != nil {
			recent.put(key, next, val, &v)
		}
		return v, next, nil
	}
	return zero, 0, fmt.Errorf("%s: %w", key, ErrContention)
}
