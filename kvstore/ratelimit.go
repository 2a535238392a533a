package kvstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// bucketState is one token bucket as stored.
type bucketState struct {
	Tokens float64   `json:"tokens"`
	At     time.Time `json:"at"`
}

// TakeTokens takes up to want tokens from the bucket of tenant and tool,
// which refills at rate tokens per second up to burst, with a
// compare-and-swap. It returns how many it took and, when it took none, how
// long until one is available. Clocks of the workers are assumed close; a
// worker whose clock runs behind refills nothing rather than too much.
func (s *Store) TakeTokens(ctx context.Context, tenant, tool string, rate, burst float64, want int, now time.Time) (int, time.Duration, error) {
	key := invocationKey(tenant, tool)
	for range casAttempts {
		st := bucketState{Tokens: burst, At: now}
		var rev uint64
		e, err := s.ratelimits.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return 0, 0, err
		default:
			if err := json.Unmarshal(e.Value(), &st); err != nil {
				return 0, 0, fmt.Errorf("decoding rate limit state: %w", err)
			}
			rev = e.Revision()
			if elapsed := now.Sub(st.At).Seconds(); elapsed > 0 {
				st.Tokens = math.Min(burst, st.Tokens+elapsed*rate)
				st.At = now
			}
		}
		got := min(want, int(math.Floor(st.Tokens)))
		var wait time.Duration
		if got <= 0 {
			got = 0
			wait = time.Duration((1 - st.Tokens) / rate * float64(time.Second))
			if rev != 0 {
				return 0, wait, nil // nothing to write
			}
		}
		st.Tokens -= float64(got)
		val, _ := json.Marshal(st)
		if rev == 0 {
			_, err = s.ratelimits.Create(ctx, key, val)
		} else {
			_, err = s.ratelimits.Update(ctx, key, val, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err != nil {
			return 0, 0, fmt.Errorf("updating rate limit state: %w", err)
		}
		return got, wait, nil
	}
	return 0, 0, fmt.Errorf("rate limit of %s/%s: too much contention", tenant, tool)
}
