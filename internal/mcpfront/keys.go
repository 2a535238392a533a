package mcpfront

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolgate/toolgate/internal/token"
)

// DefaultKeysInterval is how often a front end that verifies tokens with
// the key set the bus publishes fetches it again, to drop keys rotated
// out; a key rotated in is fetched on the first token naming it.
const DefaultKeysInterval = time.Minute

// keysMinRefetch bounds the fetches tokens of unknown kids cause: a
// forged kid costs at most one request to the control service this often.
const keysMinRefetch = time.Second

// keysTimeout bounds one fetch.
const keysTimeout = 5 * time.Second

// keyFetcher is a Bus that can fetch the key set the deployment verifies
// tokens with (NATSBus: tool.svc.tokens.keys).
type keyFetcher interface {
	TokenKeys(ctx context.Context) ([]byte, error)
}

// busKeys is a token.Refresher over the key set the control service
// publishes: fetched at start, again every interval, and on a token whose
// kid it lacks. A fetch that fails or does not parse keeps the last good
// set.
type busKeys struct {
	fetch func(ctx context.Context) ([]byte, error)
	log   *slog.Logger
	cur   atomic.Pointer[token.KeySet]

	mu   sync.Mutex
	last time.Time // of the last fetch
}

var _ token.Refresher = (*busKeys)(nil)

func (k *busKeys) KeySet() *token.KeySet { return k.cur.Load() }

// load fetches the set now; the caller holds mu or is alone.
func (k *busKeys) load(ctx context.Context) error {
	k.last = time.Now()
	ctx, cancel := context.WithTimeout(ctx, keysTimeout)
	defer cancel()
	b, err := k.fetch(ctx)
	if err != nil {
		return fmt.Errorf("fetching the token key set: %w", err)
	}
	ks, err := token.ParseKeySet(b)
	if err != nil {
		return fmt.Errorf("the token key set the bus published: %w", err)
	}
	if old := k.cur.Swap(ks); old == nil || old.Fingerprint() != ks.Fingerprint() {
		k.log.Info("token key set from the bus", "kids", ks.Kids(), "fingerprint", ks.Fingerprint())
	}
	return nil
}

// Refresh fetches the set again for a token of kid, unless it was fetched
// less than keysMinRefetch ago, and returns the set in force.
func (k *busKeys) Refresh(kid string) *token.KeySet {
	k.mu.Lock()
	defer k.mu.Unlock()
	if time.Since(k.last) >= keysMinRefetch {
		if err := k.load(context.Background()); err != nil {
			k.log.Warn("a token names a key not in the set; fetching the set again failed", "kid", kid, "err", err)
		}
	}
	return k.cur.Load()
}

// watch fetches the set every interval until ctx ends.
func (k *busKeys) watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		k.mu.Lock()
		err := k.load(ctx)
		k.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			k.log.Warn("keeping the token key set in force", "err", err)
		}
	}
}
