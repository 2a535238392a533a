package kvstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
)

// shardRecorder keeps one process's share of a statistics bucket (tools',
// models'): totals of type S by key K in memory, written whole to this
// process's own shard keys with plain puts. Each shard key has one writer,
// so recording needs no compare-and-swap and no shared counter; readers
// merge the shards (mergeShards). With a window, a shard covers one window
// and the recorder then starts a new one, leaving the old to the bucket's
// max age; without, one shard serves the process's life.
type shardRecorder[K comparable, S any] struct {
	kv     jetstream.KeyValue
	what   string // what the bucket holds, for errors
	base   string
	window time.Duration
	now    func() time.Time
	key    func(k K, shard string) string

	mu      sync.Mutex
	epoch   int64
	totals  map[K]*S
	dirty   map[K]bool
	last    map[K]time.Time   // when each key's last write began
	pending map[string][]byte // full key → value of ended windows, still to write

	flushMu sync.Mutex // one write at a time
}

func newShardRecorder[K comparable, S any](kv jetstream.KeyValue, what string, window time.Duration, key func(K, string) string) *shardRecorder[K, S] {
	return &shardRecorder[K, S]{kv: kv, what: what, base: strings.ReplaceAll(uuid.NewString(), "-", ""),
		window: window, now: time.Now, key: key,
		totals: map[K]*S{}, dirty: map[K]bool{}, last: map[K]time.Time{}, pending: map[string][]byte{}}
}

func (r *shardRecorder[K, S]) shard(epoch int64) string {
	if r.window <= 0 {
		return r.base
	}
	return r.base + "_" + strconv.FormatInt(epoch, 10)
}

// rotate starts a new window when the current one has ended, keeping what
// the ended one has not written yet; the caller holds mu.
func (r *shardRecorder[K, S]) rotate(now time.Time) {
	if r.window <= 0 {
		return
	}
	epoch := now.UnixNano() / int64(r.window)
	if epoch == r.epoch {
		return
	}
	for k := range r.dirty {
		r.pending[r.key(k, r.shard(r.epoch))], _ = json.Marshal(r.totals[k])
	}
	r.epoch = epoch
	clear(r.totals)
	clear(r.dirty)
	clear(r.last)
}

// add applies count to k's totals of the current window; the caller holds
// mu.
func (r *shardRecorder[K, S]) add(k K, now time.Time, count func(*S)) {
	r.rotate(now)
	t := r.totals[k]
	if t == nil {
		t = new(S)
		r.totals[k] = t
	}
	count(t)
	r.dirty[k] = true
}

// Flush writes every changed total, after any write under way. A failed
// write is retried by the next.
func (r *shardRecorder[K, S]) Flush(ctx context.Context) error {
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	return r.flush(ctx)
}

// flush writes the changed totals; the caller holds flushMu.
func (r *shardRecorder[K, S]) flush(ctx context.Context) error {
	r.mu.Lock()
	now := r.now()
	r.rotate(now)
	batch := r.pending
	r.pending = map[string][]byte{}
	current := map[string]K{}
	for k := range r.dirty {
		key := r.key(k, r.shard(r.epoch))
		batch[key], _ = json.Marshal(r.totals[k])
		current[key] = k
		r.last[k] = now
	}
	clear(r.dirty)
	epoch := r.epoch
	r.mu.Unlock()
	var errs []error
	for key, val := range batch {
		if _, err := r.kv.Put(ctx, key, val); err != nil {
			errs = append(errs, fmt.Errorf("writing %s %s: %w", r.what, key, err))
			r.mu.Lock()
			if k, ok := current[key]; ok && epoch == r.epoch {
				r.dirty[k] = true // the next write takes the newer totals
			} else if _, newer := r.pending[key]; !newer {
				r.pending[key] = val // unless its window ended with newer totals
			}
			r.mu.Unlock()
		}
	}
	return errors.Join(errs...)
}

// mergeShards reads every shard of kv and merges the ones parse and decode
// accept, by the key parse gives. A shard deleted, expired or unreadable
// since listed is left out.
func mergeShards[K comparable, S any](ctx context.Context, s *Store, kv jetstream.KeyValue, what string,
	parse func(key string) (K, bool), decode func([]byte) (S, error), merge func(into *S, from S)) (map[K]S, error) {
	keys, err := s.keys(ctx, kv, ">")
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", what, err)
	}
	out := map[K]S{}
	for _, key := range keys {
		k, ok := parse(key)
		if !ok {
			continue
		}
		e, err := kv.Get(ctx, key)
		if err != nil {
			continue
		}
		sh, err := decode(e.Value())
		if err != nil {
			continue
		}
		t := out[k]
		merge(&t, sh)
		out[k] = t
	}
	return out, nil
}
