package kvstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// Breaker states as stored.
const (
	BreakerClosed   = "closed"
	BreakerOpen     = "open"
	BreakerHalfOpen = "half_open"
)

// BreakerState is the shared state of one circuit breaker.
type BreakerState struct {
	Key   string    `json:"key"`
	State string    `json:"state"`
	Since time.Time `json:"since"`
	// Probes are the half-open trial calls still to hand out, across all
	// workers.
	Probes int `json:"probes,omitempty"`
	// Successes counts the trial calls that succeeded while half open.
	Successes int `json:"successes,omitempty"`
	// Forced is set by an operator: the state holds until changed by hand.
	Forced bool   `json:"forced,omitempty"`
	By     string `json:"by,omitempty"`
	// Proof is the operator's signed breakers.set request of the last
	// forced state or release; readers on an authenticated bus honour no
	// forced state without one (internal/signedstate).
	Proof *api.DecisionProof `json:"proof,omitempty"`
	// Unannounced is the outbox of the state's transitions: each is written
	// in the same compare-and-swap as the state it announces and removed
	// once its event is on the audit stream, so a writer that dies between
	// the two leaves it for another worker to announce.
	Unannounced []BreakerEvent `json:"unannounced,omitempty"`
	// Revision is the KV revision the state was read at.
	Revision uint64 `json:"-"`
}

// BreakerEvent is a transition event waiting in a breaker's outbox; Data is
// the event's data as the breaker package encodes it.
type BreakerEvent struct {
	ID   string          `json:"id"`
	Type string          `json:"type"`
	At   time.Time       `json:"at"`
	Data json.RawMessage `json:"data"`
}

// maxUnannounced bounds a breaker's outbox; past it the oldest event goes.
// Transitions come seconds apart at the least, so only an outbox nobody
// can announce (no audit stream) ever fills.
const maxUnannounced = 16

// Enqueue adds e to the outbox, dropping the oldest past its bound.
func (b *BreakerState) Enqueue(e BreakerEvent) {
	b.Unannounced = append(b.Unannounced, e)
	if n := len(b.Unannounced) - maxUnannounced; n > 0 {
		b.Unannounced = append(b.Unannounced[:0], b.Unannounced[n:]...)
	}
}

func breakerKey(key string) string { return subjects.Token(key) }

// Breaker returns the stored state of a breaker; a breaker never stored is
// closed.
func (s *Store) Breaker(ctx context.Context, key string) (BreakerState, error) {
	e, err := s.breakers.Get(ctx, breakerKey(key))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return BreakerState{Key: key, State: BreakerClosed}, nil
	}
	if err != nil {
		return BreakerState{}, err
	}
	var b BreakerState
	if err := json.Unmarshal(e.Value(), &b); err != nil {
		return BreakerState{}, fmt.Errorf("decoding breaker: %w", err)
	}
	b.Revision = e.Revision()
	return b, nil
}

// TransitionBreaker moves a breaker to next if change allows it, with a
// compare-and-swap: of several workers making the same transition at once,
// exactly one gets won=true and announces it. change sees the stored state
// and returns false to leave it.
func (s *Store) TransitionBreaker(ctx context.Context, key string, change func(cur *BreakerState) bool) (BreakerState, bool, error) {
	won := false
	next, rev, err := update(ctx, s.breakers, breakerKey(key), func(b *BreakerState, exists bool) error {
		won = false
		if !exists {
			*b = BreakerState{Key: key, State: BreakerClosed}
		}
		next := *b
		if !change(&next) {
			return ErrUnchanged
		}
		next.Key = key
		*b, won = next, true
		return nil
	})
	if errors.Is(err, ErrContention) {
		return BreakerState{}, false, fmt.Errorf("breaker %s: %w", key, err)
	}
	if err != nil {
		return BreakerState{}, false, fmt.Errorf("updating breaker: %w", err)
	}
	next.Revision = rev
	return next, won, nil
}

// Settle removes the events of ids from the outbox and reports whether any
// was there.
func (b *BreakerState) Settle(ids ...string) bool {
	n := len(b.Unannounced)
	b.Unannounced = slices.DeleteFunc(b.Unannounced, func(e BreakerEvent) bool { return slices.Contains(ids, e.ID) })
	return len(b.Unannounced) < n
}

// WatchBreakers calls fn with every stored breaker state and each change.
func (s *Store) WatchBreakers(ctx context.Context, fn func(BreakerState)) error {
	return s.watch(ctx, s.breakers, func(e jetstream.KeyValueEntry) {
		if e.Operation() != jetstream.KeyValuePut {
			key, err := subjects.Untoken(e.Key())
			if err == nil {
				fn(BreakerState{Key: key, State: BreakerClosed, Revision: e.Revision()})
			}
			return
		}
		var b BreakerState
		if json.Unmarshal(e.Value(), &b) == nil {
			b.Revision = e.Revision()
			fn(b)
		}
	})
}

// Breakers lists every stored breaker.
func (s *Store) Breakers(ctx context.Context) ([]BreakerState, error) {
	keys, err := s.keys(ctx, s.breakers, ">")
	if err != nil {
		return nil, err
	}
	var out []BreakerState
	for _, k := range keys {
		key, err := subjects.Untoken(k)
		if err != nil {
			continue
		}
		b, err := s.Breaker(ctx, key)
		if err == nil {
			out = append(out, b)
		}
	}
	return out, nil
}
