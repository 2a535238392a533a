package kvstore

import (
	"context"
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
}

func (b bounded) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.KeyValue.Get(ctx, key)
}

func (b bounded) GetRevision(ctx context.Context, key string, revision uint64) (jetstream.KeyValueEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.KeyValue.GetRevision(ctx, key, revision)
}

func (b bounded) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.KeyValue.Put(ctx, key, value)
}

func (b bounded) PutString(ctx context.Context, key string, value string) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.KeyValue.PutString(ctx, key, value)
}

func (b bounded) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.KeyValue.Create(ctx, key, value, opts...)
}

func (b bounded) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.KeyValue.Update(ctx, key, value, revision)
}

func (b bounded) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.KeyValue.Delete(ctx, key, opts...)
}

func (b bounded) Purge(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.KeyValue.Purge(ctx, key, opts...)
}
