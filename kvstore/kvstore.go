// Package kvstore is typed access to toolgate's JetStream KV buckets. No
// other package names a bucket or builds a key; they call this one. Every
// write that must not lose a concurrent update is a compare-and-swap on the
// key's revision.
package kvstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/subjects"
)

// Bucket names.
const (
	BucketTools       = subjects.BucketTools
	BucketInvocations = subjects.BucketInvocations
	BucketRevocations = subjects.BucketRevocations
	BucketPolicies    = subjects.BucketPolicies
	BucketApprovals   = subjects.BucketApprovals
	BucketBudgets     = subjects.BucketBudgets
	BucketRateLimits  = subjects.BucketRateLimits
	BucketIdempotency = subjects.BucketIdempotency
	BucketCheckpoints = subjects.BucketCheckpoints
	BucketBreakers    = subjects.BucketBreakers
	BucketHooks       = subjects.BucketHooks
)

// Options shape the buckets when Open creates them. Existing buckets are left
// as they are, so an operator's tuning survives restarts.
type Options struct {
	Replicas int
	Storage  jetstream.StorageType
	// InvocationTTL is how long invocation records are kept; default 7 days.
	InvocationTTL time.Duration
	// IdempotencyTTL is how long an idempotency key is remembered; default 24 h.
	IdempotencyTTL time.Duration
	// CheckpointMicroTTL is how long a micro checkpoint can be resumed
	// (default DefaultMicroTTL), CheckpointRetention how long a macro
	// checkpoint is kept (default DefaultMacroRetention).
	CheckpointMicroTTL  time.Duration
	CheckpointRetention time.Duration
	// Clock, when set, is the time checkpoints are stamped and expired by
	// (tests move it forward); the bucket's own TTLs run on the server's.
	Clock func() time.Time
	// ModelStatsTTL is how long a model statistics shard counts after its
	// last write; default DefaultModelStatsTTL.
	ModelStatsTTL time.Duration
	// OpTimeout bounds each single-key read or write, whatever the caller's
	// context allows; default DefaultOpTimeout.
	OpTimeout time.Duration
	// Buckets are the buckets to open; nil opens them all. The others
	// answer ErrNotBound: a role opens only those it has rights on.
	Buckets []string
	// Bind opens existing buckets only, waiting for none: creating them
	// (and their republishing for watches) is the operator's, through
	// topology setup. Without Bind, Open creates what is missing and
	// brings the watched buckets' republishing up to date.
	Bind bool
	// Memory, when set, is what the stores of one process remember of
	// their writes to the invocations and budgets buckets, shared by them
	// all (NewMemory); without it a store remembers only its own.
	Memory *Memory
	// CheckTool, when set, judges every tool record before the store's
	// tool watches apply it (signed state: internal/signedstate).
	CheckTool CheckTool
	// CheckModel, likewise, judges model catalogue and routing policy
	// records.
	CheckModel CheckModel
	// CheckRevocation, likewise, judges revocation records.
	CheckRevocation CheckRevocation
}

// Memory is what a process remembers of its own writes to the keys its
// stages write in turn (recent.go). The stages of one process each have a
// connection and a store of their own (one bus role each); sharing one
// Memory lets execute's and audit's compare-and-swaps of a status record
// start from validate's write, and audit's charge of a usage from
// authorize's reservation, without reading the key first; and a route
// worker's next lease of a rate-limit bucket from its last.
type Memory struct {
	invocations, budgets, ratelimits recentWrites
}

// NewMemory returns an empty Memory.
func NewMemory() *Memory { return &Memory{} }

// Store gives typed access to the buckets.
type Store struct {
	tools           jetstream.KeyValue
	invocations     jetstream.KeyValue
	revocations     jetstream.KeyValue
	policies        jetstream.KeyValue
	approvals       jetstream.KeyValue
	budgets         jetstream.KeyValue
	ratelimits      jetstream.KeyValue
	agentruns       jetstream.KeyValue
	idempotency     jetstream.KeyValue
	checkpoints     jetstream.KeyValue
	breakers        jetstream.KeyValue
	settings        jetstream.KeyValue
	models          jetstream.KeyValue
	hooks           jetstream.KeyValue
	toolstats       jetstream.KeyValue
	modelstats      jetstream.KeyValue
	capability      jetstream.KeyValue
	docsources      jetstream.KeyValue
	doccache        jetstream.KeyValue
	watches         sync.WaitGroup
	checkTool       CheckTool
	checkModel      CheckModel
	checkRevocation CheckRevocation

	js jetstream.JetStream
	nc *nats.Conn

	modelStatsTTL time.Duration // the model statistics bucket's max age

	microTTL, macroRetention time.Duration // checkpoints' lifetimes
	clock                    func() time.Time

	usageMu      sync.Mutex
	usageBatches map[string]*usageBatch // keys whose usage is being written

	// onErased hears of rate-limit counters found deleted (ratelimit.go).
	onErased func(ctx context.Context, tenant, tool string)
	// signCheckpoint signs the checkpoints this store writes and
	// checkpointSigned checks those it reads (checkpoints.go); nil on a
	// bus without signing keys.
	signCheckpoint   func(desc []byte) string
	checkpointSigned func(desc []byte, sig string) bool
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
	if o.IdempotencyTTL == 0 {
		o.IdempotencyTTL = 24 * time.Hour
	}
	if o.CheckpointMicroTTL <= 0 {
		o.CheckpointMicroTTL = DefaultMicroTTL
	}
	if o.CheckpointRetention <= 0 {
		o.CheckpointRetention = DefaultMacroRetention
	}
	if o.OpTimeout <= 0 {
		o.OpTimeout = DefaultOpTimeout
	}
	if o.ModelStatsTTL <= 0 {
		o.ModelStatsTTL = DefaultModelStatsTTL
	}
	s := &Store{modelStatsTTL: o.ModelStatsTTL, js: js, nc: js.Conn(), checkTool: o.CheckTool, checkModel: o.CheckModel, checkRevocation: o.CheckRevocation,
		microTTL: o.CheckpointMicroTTL, macroRetention: o.CheckpointRetention, clock: o.Clock}
	for _, b := range []struct {
		kv  *jetstream.KeyValue
		cfg jetstream.KeyValueConfig
	}{
		{&s.tools, jetstream.KeyValueConfig{
			Bucket: BucketTools, Description: "toolgate tool manifests by id and version", History: 5,
		}},
		{&s.invocations, jetstream.KeyValueConfig{
			Bucket: BucketInvocations, Description: "toolgate invocation status by tenant and id",
			History: 1, TTL: o.InvocationTTL,
		}},
		// Revocations expire with the token they revoke (a per-key TTL).
		{&s.revocations, jetstream.KeyValueConfig{
			Bucket: BucketRevocations, Description: "toolgate revoked capability token ids",
			History: 1, LimitMarkerTTL: time.Minute,
		}},
		// Each push replaces the one bundle whole; history keeps the last few.
		{&s.policies, jetstream.KeyValueConfig{
			Bucket: BucketPolicies, Description: "toolgate authorization policy bundle", History: 10,
		}},
		{&s.approvals, jetstream.KeyValueConfig{
			Bucket: BucketApprovals, Description: "toolgate human approvals by tenant and invocation",
			History: 1, TTL: o.InvocationTTL,
		}},
		// Idle buckets expire: a missing bucket is a full one.
		{&s.ratelimits, jetstream.KeyValueConfig{
			Bucket: BucketRateLimits, Description: "toolgate token buckets by tenant and tool",
			History: 1, TTL: 24 * time.Hour,
		}},
		// Only execute writes it: another role cannot fill an agent's
		// slots. A lease lapses in AgentRunLease; an idle key in a day.
		{&s.agentruns, jetstream.KeyValueConfig{
			Bucket: subjects.BucketAgentRuns, Description: "toolgate running calls by tenant and agent",
			History: 1, TTL: 24 * time.Hour,
		}},
		{&s.idempotency, jetstream.KeyValueConfig{
			Bucket: BucketIdempotency, Description: "toolgate idempotency keys by tenant",
			History: 1, TTL: o.IdempotencyTTL,
		}},
		// Each key has its own TTL, by its checkpoint's kind
		// (checkpoints.go); named checkpoints have none.
		{&s.checkpoints, jetstream.KeyValueConfig{
			Bucket: BucketCheckpoints, Description: "toolgate checkpoints by tenant, invocation and sequence",
			History: 1, LimitMarkerTTL: time.Minute,
		}},
		{&s.breakers, jetstream.KeyValueConfig{
			Bucket: BucketBreakers, Description: "toolgate circuit breaker state by tool or endpoint", History: 5,
		}},
		{&s.settings, jetstream.KeyValueConfig{
			Bucket: subjects.BucketSettings, Description: "toolgate security settings every worker must share", History: 10,
		}},
		{&s.models, jetstream.KeyValueConfig{
			Bucket: subjects.BucketModels, Description: "toolgate model catalogue by name", History: 5,
		}},
		// Each push replaces a tenant's hook set whole.
		{&s.hooks, jetstream.KeyValueConfig{
			Bucket: BucketHooks, Description: "toolgate hook sets by tenant", History: 5,
		}},
		{&s.toolstats, jetstream.KeyValueConfig{
			Bucket: BucketToolStats, Description: "toolgate tool usage statistics by tool and audit process", History: 1,
		}},
		// Each shard has one writer; the max age expires shards nobody
		// writes any more (ended windows, dead processes).
		{&s.modelstats, jetstream.KeyValueConfig{
			Bucket: BucketModelStats, Description: "toolgate model performance statistics by model, task type and execute process",
			History: 1, TTL: o.ModelStatsTTL,
		}},
		{&s.capability, jetstream.KeyValueConfig{
			Bucket: BucketCapabilities, Description: "toolgate capability requests and what they were granted, by tenant and request",
			History: 1, TTL: o.InvocationTTL,
		}},
		{&s.budgets, jetstream.KeyValueConfig{
			Bucket: BucketBudgets, Description: "toolgate session usage by tenant and session",
			History: 1, TTL: o.InvocationTTL,
		}},
		{&s.docsources, docSourcesConfig},
		{&s.doccache, docCacheConfig},
	} {
		if o.Buckets != nil && !slices.Contains(o.Buckets, b.cfg.Bucket) {
			*b.kv = unbound{b.cfg.Bucket}
			continue
		}
		b.cfg.Replicas, b.cfg.Storage = o.Replicas, o.Storage
		if pattern, ok := subjects.WatchedKeys(b.cfg.Bucket); ok {
			b.cfg.RePublish = &jetstream.RePublish{
				Source:      "$KV." + b.cfg.Bucket + "." + pattern,
				Destination: subjects.KVFeed(b.cfg.Bucket) + pattern,
			}
		}
		var kv jetstream.KeyValue
		var err error
		if o.Bind {
			kv, err = js.KeyValue(ctx, b.cfg.Bucket)
			if err != nil {
				err = fmt.Errorf("opening bucket %s: %w", b.cfg.Bucket, err)
			}
		} else {
			kv, err = ensure(ctx, js, b.cfg)
		}
		if err != nil {
			return nil, err
		}
		*b.kv = newBounded(kv, o.OpTimeout)
	}
	// The keys the stages of one process write in turn: their
	// compare-and-swaps start from this process's last write (recent.go).
	mem := o.Memory
	if mem == nil {
		mem = NewMemory()
	}
	for _, b := range []struct {
		kv     *jetstream.KeyValue
		recent *recentWrites
	}{{&s.invocations, &mem.invocations}, {&s.budgets, &mem.budgets}, {&s.ratelimits, &mem.ratelimits}} {
		if kv, ok := (*b.kv).(bounded); ok {
			*b.kv = remembering{kv, b.recent}
		}
	}
	// A bucket created earlier keeps its own max age: that is the one
	// that expires shards.
	if st, err := s.modelstats.Status(ctx); err == nil && st.TTL() > 0 {
		s.modelStatsTTL = st.TTL()
	}
	return s, nil
}

func ensure(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := ensureBucket(ctx, js, cfg)
	if err != nil {
		return nil, err
	}
	return kv, eraseProof(ctx, js, cfg.Bucket)
}

// eraseProof makes the stream of a bucket in which a missing key grants
// more than a stored one (a rate-limit counter: missing is full) refuse
// purges and deletes, whoever may write the bucket: a KV purge is a
// roll-up, which a stream that denies purges refuses, and JetStream never
// lifts either denial once set. A KV delete is a marker message, which
// no stream setting refuses; the reader counts it (UpdateBucket).
func eraseProof(ctx context.Context, js jetstream.JetStream, bucket string) error {
	if bucket != BucketRateLimits {
		return nil
	}
	st, err := js.Stream(ctx, subjects.BucketStream(bucket))
	if err != nil {
		return fmt.Errorf("bucket %s: %w", bucket, err)
	}
	sc := st.CachedInfo().Config
	if sc.DenyPurge && sc.DenyDelete && !sc.AllowRollup {
		return nil
	}
	sc.DenyPurge, sc.DenyDelete, sc.AllowRollup = true, true, false
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		return fmt.Errorf("bucket %s: refusing purges: %w", bucket, err)
	}
	return nil
}

func ensureBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err == nil {
		if err := perKeyTTL(ctx, js, cfg); err != nil {
			return nil, err
		}
		return kv, republish(ctx, js, cfg)
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

// perKeyTTL lets an existing bucket whose keys now carry TTLs of their own
// (cfg.LimitMarkerTTL) take them: the checkpoints bucket of a store made
// before checkpoints had kinds kept one max age for all, which would also
// expire named checkpoints, so that max age goes.
func perKeyTTL(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) error {
	if cfg.LimitMarkerTTL <= 0 {
		return nil
	}
	st, err := js.Stream(ctx, subjects.BucketStream(cfg.Bucket))
	if err != nil {
		return fmt.Errorf("bucket %s: %w", cfg.Bucket, err)
	}
	sc := st.CachedInfo().Config
	if sc.AllowMsgTTL && sc.SubjectDeleteMarkerTTL > 0 {
		return nil
	}
	sc.AllowMsgTTL, sc.SubjectDeleteMarkerTTL = true, cfg.LimitMarkerTTL
	if cfg.Bucket == BucketCheckpoints {
		sc.MaxAge = 0
	}
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		return fmt.Errorf("bucket %s: allowing per-key TTLs: %w", cfg.Bucket, err)
	}
	return nil
}

// republish brings an existing bucket's republishing in line with cfg's
// (a store made before watches were republished), leaving the rest of its
// configuration, an operator's tuning included, as it is.
func republish(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) error {
	if cfg.RePublish == nil {
		return nil
	}
	st, err := js.Stream(ctx, subjects.BucketStream(cfg.Bucket))
	if err != nil {
		return fmt.Errorf("bucket %s: %w", cfg.Bucket, err)
	}
	sc := st.CachedInfo().Config
	if r := sc.RePublish; r != nil && r.Source == cfg.RePublish.Source && r.Destination == cfg.RePublish.Destination && !r.HeadersOnly {
		return nil
	}
	sc.RePublish = cfg.RePublish
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		return fmt.Errorf("bucket %s: republishing its changes: %w", cfg.Bucket, err)
	}
	return nil
}
