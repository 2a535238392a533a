package kvstore

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Wait returns when every watch the store started has stopped, which each
// does once its context is done.
func (s *Store) Wait() { s.watches.Wait() }

// watch calls fn for every entry of kv, in order, until ctx is done. It
// returns once the values stored at the time of the call have all been
// applied, so a caller never serves with half-loaded state.
func (s *Store) watch(ctx context.Context, kv jetstream.KeyValue, fn func(jetstream.KeyValueEntry)) error {
	return s.watchKeys(ctx, kv, ">", fn)
}

// watchKeys is watch for the keys matching pattern only.
func (s *Store) watchKeys(ctx context.Context, kv jetstream.KeyValue, pattern string, fn func(jetstream.KeyValueEntry)) error {
	w, err := kv.Watch(ctx, pattern)
	if err != nil {
		return fmt.Errorf("watching %s: %w", kv.Bucket(), err)
	}
	ready := make(chan struct{})
	s.watches.Add(1)
	go func() {
		defer s.watches.Done()
		defer func() { _ = w.Stop() }()
		loaded := false
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil { // the initial values have all been delivered
					if !loaded {
						loaded = true
						close(ready)
					}
					continue
				}
				fn(e)
			}
		}
	}()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
