// Package kvstore is typed access to toolgate's JetStream KV buckets. No
// other package names a bucket or builds a key; they call this one. Every
// write that must not lose a concurrent update is a compare-and-swap on the
// key's revision.
package kvstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Bucket names.
const (
	BucketTools       = "toolgate_tools"
	BucketInvocations = "toolgate_invocations"
)

// Options shape the buckets when Open creates them. Existing buckets are left
// as they are, so an operator's tuning survives restarts.
type Options struct {
	Replicas int
	Storage  jetstream.StorageType
	// InvocationTTL is how long invocation records are kept; default 7 days.
	InvocationTTL time.Duration
}

// Store gives typed access to the buckets.
type Store struct {
	tools       jetstream.KeyValue
	invocations jetstream.KeyValue
}

// Open opens the buckets, creating any that are missing. It is safe to call
// from many processes at once.
func Open(ctx context.Context, js jetstream.JetStream, o Options) (*Store, error) {
	if o.Replicas < 1 {
		o.Replicas = 1
	}
	if o.InvocationTTL == 0 {
		o.InvocationTTL = 7 * 24 * time.Hour
	}
	tools, err := ensure(ctx, js, jetstream.KeyValueConfig{
		Bucket: BucketTools, Description: "toolgate tool manifests by id and version",
		History: 5, Replicas: o.Replicas, Storage: o.Storage,
	})
	if err != nil {
		return nil, err
	}
	invs, err := ensure(ctx, js, jetstream.KeyValueConfig{
		Bucket: BucketInvocations, Description: "toolgate invocation status by tenant and id",
		History: 1, TTL: o.InvocationTTL, Replicas: o.Replicas, Storage: o.Storage,
	})
	if err != nil {
		return nil, err
	}
	return &Store{tools: tools, invocations: invs}, nil
}

func ensure(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("opening bucket %s: %w", cfg.Bucket, err)
	}
	kv, err = js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		// Another process created it first.
		return js.KeyValue(ctx, cfg.Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("creating bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}
