package kvstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/subjects"
)

// Wait returns when every watch the store started has stopped, which each
// does once its context is done.
func (s *Store) Wait() { s.watches.Wait() }

// ErrNotWatchable is returned for a watch of a bucket whose changes the
// topology does not republish (subjects.WatchedKeys).
var ErrNotWatchable = errors.New("kvstore: bucket is not republished for watching")

// watch calls fn for every entry of kv, in order, until ctx is done. It
// returns once the values stored at the time of the call have all been
// applied, so a caller never serves with half-loaded state.
func (s *Store) watch(ctx context.Context, kv jetstream.KeyValue, fn func(jetstream.KeyValueEntry)) error {
	return s.watchKeys(ctx, kv, ">", fn)
}

// watchKeys is watch for the keys matching pattern only.
//
// A watch is a plain subscription to the bucket's republished changes
// (subjects.KVFeed), started before the current values are read, so no
// change falls between the two: a change the read already saw (by
// revision) is skipped, every later one is applied in order. It needs no
// JetStream consumer, so no role needs the right to create one.
func (s *Store) watchKeys(ctx context.Context, kv jetstream.KeyValue, pattern string, fn func(jetstream.KeyValueEntry)) error {
	bucket := kv.Bucket()
	fed, ok := subjects.WatchedKeys(bucket)
	if !ok || (fed != ">" && !strings.HasPrefix(pattern, strings.TrimSuffix(fed, ">"))) {
		return fmt.Errorf("watching %s %s: %w", bucket, pattern, ErrNotWatchable)
	}
	if s.nc == nil {
		return fmt.Errorf("watching %s: %w", bucket, ErrNotBound)
	}
	feed := subjects.KVFeed(bucket)
	q := &feedQueue{wake: make(chan struct{}, 1)}
	sub, err := s.nc.Subscribe(feed+pattern, q.push)
	if err != nil {
		return fmt.Errorf("watching %s: %w", bucket, err)
	}
	// A slow watcher is told, not silently behind: the buffer is large
	// (watch functions only update memory), and a dropped change is logged
	// by the connection's error handler.
	_ = sub.SetPendingLimits(1<<20, 256<<20)
	// The subscription reaches the server before the values are read.
	fctx, cancel := context.WithTimeout(ctx, DefaultOpTimeout)
	err = s.nc.FlushWithContext(fctx)
	cancel()
	if err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("watching %s: %w", bucket, err)
	}
	// The server refuses a subscription by telling the connection, not
	// the caller; its answer came before the flush's.
	if err := s.nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), feed) {
		_ = sub.Unsubscribe()
		return fmt.Errorf("watching %s: %w", bucket, err)
	}
	loaded, err := s.snapshot(ctx, kv, pattern)
	if err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("watching %s: %w", bucket, err)
	}
	seen := make(map[string]uint64, len(loaded))
	for _, e := range loaded {
		seen[e.Key()] = e.Revision()
		fn(e)
	}
	s.watches.Add(1)
	go func() {
		defer s.watches.Done()
		defer func() { _ = sub.Unsubscribe() }()
		for {
			for _, m := range q.take() {
				e, ok := feedEntry(bucket, feed, m)
				if !ok {
					continue
				}
				if rev, ok := seen[e.key]; ok {
					if e.rev <= rev {
						continue // the snapshot had it
					}
					delete(seen, e.key)
				}
				fn(e)
			}
			select {
			case <-ctx.Done():
				return
			case <-q.wake:
			}
		}
	}()
	return nil
}

// feedQueue hands republished changes from the subscription's goroutine to
// the watch's, unbounded, so the connection never blocks on a watcher.
type feedQueue struct {
	mu   sync.Mutex
	msgs []*nats.Msg
	wake chan struct{}
}

func (q *feedQueue) push(m *nats.Msg) {
	q.mu.Lock()
	q.msgs = append(q.msgs, m)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *feedQueue) take() []*nats.Msg {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.msgs
	q.msgs = nil
	return out
}

// snapshot reads the current value of every key of kv matching pattern,
// in revision order.
func (s *Store) snapshot(ctx context.Context, kv jetstream.KeyValue, pattern string) ([]*entry, error) {
	keys, err := s.keys(ctx, kv, pattern)
	if err != nil {
		return nil, err
	}
	out := make([]*entry, 0, len(keys))
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue // deleted, or gone since the listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, &entry{bucket: kv.Bucket(), key: k, value: e.Value(), rev: e.Revision(), created: e.Created(), op: e.Operation()})
	}
	sortByRevision(out)
	return out, nil
}

// keys lists the keys of kv matching pattern (deleted ones included: a
// caller reads each and skips what is gone). It reads the stream's subject
// counts: listing keys through a consumer would need the right to create
// one.
func (s *Store) keys(ctx context.Context, kv jetstream.KeyValue, pattern string) ([]string, error) {
	if s.js == nil {
		return nil, ErrNotBound
	}
	st, err := s.js.Stream(ctx, subjects.BucketStream(kv.Bucket()))
	if err != nil {
		return nil, err
	}
	prefix := "$KV." + kv.Bucket() + "."
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(prefix+pattern))
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		out = append(out, strings.TrimPrefix(subj, prefix))
	}
	return out, nil
}

// feedEntry reads a republished change.
func feedEntry(bucket, feed string, m *nats.Msg) (*entry, bool) {
	key, ok := strings.CutPrefix(m.Subject, feed)
	if !ok || key == "" {
		return nil, false
	}
	rev, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return nil, false
	}
	e := &entry{bucket: bucket, key: key, value: m.Data, rev: rev, op: jetstream.KeyValuePut}
	if ts, err := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer)); err == nil {
		e.created = ts
	}
	switch m.Header.Get("KV-Operation") {
	case "DEL":
		e.op = jetstream.KeyValueDelete
	case "PURGE":
		e.op = jetstream.KeyValuePurge
	}
	if m.Header.Get(jetstream.MarkerReasonHeader) != "" {
		e.op = jetstream.KeyValuePurge // the server removed it (its TTL ran out)
	}
	return e, true
}

// entry is a jetstream.KeyValueEntry read from a snapshot or the feed.
type entry struct {
	bucket, key string
	value       []byte
	rev         uint64
	created     time.Time
	op          jetstream.KeyValueOp
}

func (e *entry) Bucket() string                  { return e.bucket }
func (e *entry) Key() string                     { return e.key }
func (e *entry) Value() []byte                   { return e.value }
func (e *entry) Revision() uint64                { return e.rev }
func (e *entry) Created() time.Time              { return e.created }
func (e *entry) Delta() uint64                   { return 0 }
func (e *entry) Operation() jetstream.KeyValueOp { return e.op }

func sortByRevision(es []*entry) {
	slices.SortFunc(es, func(a, b *entry) int { return cmp.Compare(a.rev, b.rev) })
}
