package kvstore

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DefaultOpTimeout bounds one bucket read or write (Options.OpTimeout). nats.go applies its own default
// timeout only to a context without a deadline; a stage's context has one
// (the execute stage's an hour and more), and a request whose reply is lost
// (the server restarted between request and reply) would otherwise wait
// that long, holding a worker and its message. Past the bound the call fails
// and the caller retries it.
const DefaultOpTimeout = 10 * time.Second

// bounded is a bucket whose single-key operations each end within
// timeout. Watches and key listings live as long as their context.
type bounded struct {
	jetstream.KeyValue
	timeout time.Duration
	last    *atomic.Pointer[opBound]
}

func newBounded(kv jetstream.KeyValue, timeout time.Duration) bounded {
	return bounded{kv, timeout, new(atomic.Pointer[opBound])}
}

// opBound is a context that ends at a deadline, or with every context
// that ends when done closes or at parent (the zero time: no deadline),
// whichever comes first.
type opBound struct {
	done   <-chan struct{}
	parent time.Time
	at     time.Time
	ctx    context.Context
	cancel context.CancelFunc // never called: the operations under ctx end by themselves
}

// bound returns ctx ending timeout from now at the latest, and no more
// than a 32nd of it (at most 100ms) sooner. A context with a timer of its
// own for every operation cost four allocations, a timer started and
// stopped and a cancellation, on each of a call's status and usage
// writes; the operations started within the same slice of time under
// contexts that end alike (the stages' contexts are shared so:
// internal/runner) share one instead. Only nats.go reads the context
// bound returns, and it asks it nothing but when it ends. The caller calls
// the function bound returns when the operation has ended.
func (b bounded) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	at := time.Now().Add(b.timeout)
	parent, ok := ctx.Deadline()
	if ok && !parent.After(at) {
		return ctx, noCancel
	}
	at = at.Truncate(min(b.timeout/32, 100*time.Millisecond))
	done := ctx.Done()
	l := b.last.Load()
	switch {
	case l != nil && l.done == done && l.parent.Equal(parent) && l.at.Equal(at):
		return l.ctx, noCancel
	case l != nil && l.at.Equal(at):
		// Shared by others in this slice of time (a context of its own
		// for each call, as execute's, shares nothing).
		return context.WithDeadline(ctx, at)
	}
	l = &opBound{done: done, parent: parent, at: at}
	l.ctx, l.cancel = context.WithDeadline(ctx, at)
	b.last.Store(l)
	return l.ctx, noCancel
}

func noCancel() {}

func (b bounded) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	return b.KeyValue.Get(ctx, key)
}

func (b bounded) GetRevision(ctx context.Context, key string, revision uint64) (jetstream.KeyValueEntry, error) {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	return b.KeyValue.GetRevision(ctx, key, revision)
}

func (b bounded) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	return b.KeyValue.Put(ctx, key, value)
}

func (b bounded) PutString(ctx context.Context, key string, value string) (uint64, error) {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	return b.KeyValue.PutString(ctx, key, value)
}

func (b bounded) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	return b.KeyValue.Create(ctx, key, value, opts...)
}

func (b bounded) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	return b.KeyValue.Update(ctx, key, value, revision)
}

func (b bounded) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	return b.KeyValue.Delete(ctx, key, opts...)
}

func (b bounded) Purge(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	return b.KeyValue.Purge(ctx, key, opts...)
}
