package topology

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/archivestore"
	"github.com/toolgate/toolgate/internal/backoff"
	"github.com/toolgate/toolgate/subjects"
)

// TopologyOptions shape streams and consumers when EnsureTopology creates them.
// docs/operations.md explains each choice; zero values take the defaults.
type TopologyOptions struct {
	Replicas int
	Storage  jetstream.StorageType
	// Site, set in a site's process, names the site whose execute
	// consumers (subjects.SiteInputs) its worker binds to instead of the
	// hub's execute consumers.
	Site string
	// AckWait and MaxDeliver apply to every stage consumer; defaults 30s and 5.
	AckWait    time.Duration
	MaxDeliver int
	// MaxAckPending bounds the messages a stage's workers hold unacked
	// across all processes (default 1000).
	MaxAckPending int
	// ResultTTL bounds how long results are kept (default 24h); AuditMaxAge
	// how long audit events are (default 90 days, the hot retention;
	// negative: forever). Export older events first: toolgate audit export.
	ResultTTL   time.Duration
	AuditMaxAge time.Duration
	// InvocationTTL bounds how long a status record (bucket
	// toolgate_invocations) is kept after its last write, and with it an
	// approval, a capability request and a session's usage (default 7
	// days, kvstore's). It applies when the buckets are created.
	InvocationTTL time.Duration
	// CheckpointRetention is how long a macro checkpoint can be resumed
	// (default 90 days, kvstore's); micro checkpoints can be for an hour,
	// named ones until deleted (docs/checkpoints.md).
	CheckpointRetention time.Duration
	// CheckpointClock, when set, is the time checkpoints are stamped and
	// expired by: tests move it forward.
	CheckpointClock func() time.Time
	// InvokeMaxAge and PipelineMaxAge bound how long an invocation may wait
	// in the invoke and pipeline streams (default 7 days each): an outage
	// longer than that loses what waited, so size them above the longest
	// outage you plan for.
	InvokeMaxAge   time.Duration
	PipelineMaxAge time.Duration
	// Byte limits of the streams (defaults: invoke, pipeline and results
	// 1 GiB each, audit 4 GiB). Every stream discards new messages when
	// full: the publisher gets an error ("maximum bytes exceeded"), nothing
	// already stored is dropped. A full invoke stream refuses new
	// invocations; a full audit stream stops the audit stage (it retries),
	// so the pipeline fails closed rather than running unaudited.
	InvokeMaxBytes   int64
	PipelineMaxBytes int64
	ResultMaxBytes   int64
	AuditMaxBytes    int64
	// Duplicates is the dedup window of the streams but the invoke
	// stream, which has none (default 2m).
	Duplicates time.Duration
	// MemoryHops keeps the hand-offs between stages (PIPELINE) in memory
	// and the invoke stream's messages until their call ends (limits
	// retention; audit deletes each at the ending), so a server restart
	// that empties the hops is recovered by re-driving what the invoke
	// stream still holds (Redrive). For a server that restarts only
	// together with its stages (serve's embedded one): a stage process
	// outliving its server would find its hop stream gone. The relay
	// stays on disk: what it carries (events other roles emit, refusals
	// among them) has no other durable copy to be re-driven from. It
	// applies when the streams are created (docs/delivery.md).
	MemoryHops bool
	// SiteOutboxMsgs and SiteOutboxBytes bound each site's outbox
	// (subjects.StreamSite): what a site has sent that the hub has not yet
	// forwarded (defaults DefaultSiteOutboxMsgs, DefaultSiteOutboxBytes).
	// A site past them has its publishes refused; no other site's are.
	SiteOutboxMsgs  int64
	SiteOutboxBytes int64
	// StoreRoom, when set, is what the server's store can still reserve
	// for new streams (a single server reserves each file stream's byte
	// limit out of its store, by default three quarters of the disk's free
	// space when it starts; serve reads it from its embedded server). The
	// default byte limits of the streams to be made are lowered together
	// to fit in nine tenths of it, and Log hears of each.
	StoreRoom int64
	Log       *slog.Logger
}

// Defaults of TopologyOptions.
const (
	DefaultAuditMaxAge   = 90 * 24 * time.Hour
	DefaultQueueMaxAge   = 7 * 24 * time.Hour
	DefaultQueueMaxBytes = 1 << 30
	DefaultAuditMaxBytes = 4 << 30
	// DefaultMemoryHopBytes bounds the pipeline kept in memory (MemoryHops).
	DefaultMemoryHopBytes = 256 << 20
	DefaultMaxAckPending  = 1000
	DefaultResultTTL      = 24 * time.Hour
	DefaultDuplicates     = 2 * time.Minute
	DefaultAckWait        = 30 * time.Second
	DefaultMaxDeliver     = 5
	defaultResultMaxBytes = DefaultQueueMaxBytes
	// A site's outbox holds what its worker sent in the last few seconds
	// at most: the hub forwards it as it comes.
	DefaultSiteOutboxMsgs  = 2000
	DefaultSiteOutboxBytes = 64 << 20
)

func (o *TopologyOptions) defaults() {
	if o.Replicas < 1 {
		o.Replicas = 1
	}
	o.AckWait = cmp.Or(o.AckWait, DefaultAckWait)
	o.MaxDeliver = cmp.Or(o.MaxDeliver, DefaultMaxDeliver)
	o.MaxAckPending = cmp.Or(o.MaxAckPending, DefaultMaxAckPending)
	o.ResultTTL = cmp.Or(o.ResultTTL, DefaultResultTTL)
	o.Duplicates = cmp.Or(o.Duplicates, DefaultDuplicates)
	switch {
	case o.AuditMaxAge == 0:
		o.AuditMaxAge = DefaultAuditMaxAge
	case o.AuditMaxAge < 0:
		o.AuditMaxAge = 0 // JetStream's "no limit"
	}
	o.InvokeMaxAge = cmp.Or(o.InvokeMaxAge, DefaultQueueMaxAge)
	o.PipelineMaxAge = cmp.Or(o.PipelineMaxAge, DefaultQueueMaxAge)
	o.InvokeMaxBytes = cmp.Or(o.InvokeMaxBytes, DefaultQueueMaxBytes)
	o.PipelineMaxBytes = cmp.Or(o.PipelineMaxBytes, DefaultQueueMaxBytes)
	o.ResultMaxBytes = cmp.Or(o.ResultMaxBytes, defaultResultMaxBytes)
	o.AuditMaxBytes = cmp.Or(o.AuditMaxBytes, DefaultAuditMaxBytes)
	o.SiteOutboxMsgs = cmp.Or(o.SiteOutboxMsgs, DefaultSiteOutboxMsgs)
	o.SiteOutboxBytes = cmp.Or(o.SiteOutboxBytes, DefaultSiteOutboxBytes)
}

// The invoke stream keeps no duplicate window. JetStream deduplicates by
// Nats-Msg-Id across a whole stream, and the invoke stream holds every
// tenant: two tenants that send the same Nats-Msg-Id (any client may set
// it) would lose one event silently, and JetStream offers neither a
// per-subject window nor a way to rewrite the header on the way in (an
// account's import maps subjects, never headers). A stream without sources
// gets a window of at least 100ms whatever its configuration asks; one
// with sources may have none, so the invoke stream sources an empty stream
// (subjects.StreamInvokeSource). Deduplication of invocations is the
// validate stage's, per tenant: it claims (tenant, invocation id) in KV
// with the ingest sequence and a digest of the request, and a repeat ends
// with E3024 and no second result.

// Streams returns the configuration of toolgate's streams.
func Streams(o TopologyOptions) []jetstream.StreamConfig {
	o.defaults()
	hops, invoke, hopBytes := o.Storage, jetstream.WorkQueuePolicy, o.PipelineMaxBytes
	if o.MemoryHops {
		hops, invoke = jetstream.MemoryStorage, jetstream.LimitsPolicy
		// The server reserves a stream's byte limit out of its memory
		// (75 % of the machine's by default): the disk's gibibyte would
		// keep a small machine from starting. A full pipeline makes the
		// stage before it retry, and the calls wait in the invoke stream.
		hopBytes = min(hopBytes, DefaultMemoryHopBytes)
	}
	return []jetstream.StreamConfig{{
		Name: subjects.StreamInvokeSource, Description: "empty: lets " + subjects.StreamInvoke + " keep no duplicate window",
		Subjects: []string{subjects.StreamInvokeSource}, Retention: jetstream.LimitsPolicy,
		MaxAge: o.InvokeMaxAge, MaxBytes: 1 << 10, Discard: jetstream.DiscardNew,
		Replicas: o.Replicas, Storage: o.Storage,
	}, {
		Name: subjects.StreamInvoke, Description: "tool.invoke CloudEvents awaiting validation",
		Subjects: []string{subjects.InvokeAll}, Retention: invoke,
		MaxAge: o.InvokeMaxAge, MaxBytes: o.InvokeMaxBytes, Discard: jetstream.DiscardNew,
		Sources: invokeSources(), Duplicates: 0, Replicas: o.Replicas, Storage: o.Storage,
	}, {
		Name: subjects.StreamPipeline, Description: "invocations handed from stage to stage",
		Subjects: []string{subjects.PipeAll}, Retention: jetstream.WorkQueuePolicy,
		MaxAge: o.PipelineMaxAge, MaxBytes: hopBytes, Discard: jetstream.DiscardNew,
		Duplicates: o.Duplicates, Replicas: o.Replicas, Storage: hops,
	}, {
		// What roles other than audit emit for audit to publish
		// (subjects.RelayAll): a work queue like the pipeline's.
		Name: subjects.StreamRelay, Description: "audit events and results awaiting audit's check",
		Subjects: []string{subjects.RelayAll}, Retention: jetstream.WorkQueuePolicy,
		MaxAge: o.PipelineMaxAge, MaxBytes: o.PipelineMaxBytes, Discard: jetstream.DiscardNew,
		Duplicates: o.Duplicates, Replicas: o.Replicas, Storage: o.Storage,
	}, {
		Name: subjects.StreamResults, Description: "one ToolInvokeResponse per invocation",
		Subjects: []string{subjects.ResultAll}, Retention: jetstream.LimitsPolicy,
		// A late reader (an agent among them) gets a result by its subject
		// with a direct get, the one read of this stream agents may make.
		AllowDirect: true,
		MaxAge:      o.ResultTTL, MaxBytes: o.ResultMaxBytes, Discard: jetstream.DiscardNew,
		Duplicates: o.Duplicates, Replicas: o.Replicas, Storage: o.Storage,
	}, {
		Name: subjects.StreamAudit, Description: "toolgate audit trail (append-only)",
		Subjects: []string{subjects.AuditAll}, Retention: jetstream.LimitsPolicy,
		// The audit role's checkpointer reads the events in batches by
		// sequence (docs/audit.md); who may is the bus's permissions'.
		AllowDirect: true,
		MaxAge:      o.AuditMaxAge, MaxBytes: o.AuditMaxBytes, Discard: jetstream.DiscardNew,
		DenyDelete: true, DenyPurge: true,
		Duplicates: o.Duplicates, Replicas: o.Replicas, Storage: o.Storage,
	}, {
		// The signed checkpoints over AUDIT (docs/audit.md), kept as long
		// as the events they cover; a small fraction of AUDIT's bytes.
		Name: subjects.StreamAuditChain, Description: "toolgate signed checkpoints over AUDIT (append-only)",
		Subjects: []string{subjects.AuditCheckpoint}, Retention: jetstream.LimitsPolicy,
		MaxAge: o.AuditMaxAge, MaxBytes: o.AuditMaxBytes, Discard: jetstream.DiscardNew,
		DenyDelete: true, DenyPurge: true,
		Duplicates: o.Duplicates, Replicas: o.Replicas, Storage: o.Storage,
	}, deadLetterStream(o)}
}

// invokeSources are the invoke stream's sources: the empty one that lets it
// keep no duplicate window.
func invokeSources() []*jetstream.StreamSource {
	return []*jetstream.StreamSource{{Name: subjects.StreamInvokeSource}}
}

// ExecuteMaxAckPending is the execute consumers' window of unacknowledged
// messages (other stages: 1000).
const ExecuteMaxAckPending = 20000

// AuditMaxDeliver is the audit consumers' delivery limit (at least): audit
// is the last stage, with nothing after it to end an invocation it gives up
// on, so it retries a failed ending (the audit or results stream
// unavailable) for the better part of an hour of backoff, not five tries.
const AuditMaxDeliver = 100

// ConsumerConfig is the durable pull consumer of one input of stage.
func ConsumerConfig(stage string, in subjects.Input, o TopologyOptions) jetstream.ConsumerConfig {
	o.defaults()
	pending := o.MaxAckPending
	if stage == subjects.Execute {
		// Calls put back for their tenant's quota stay pending until they
		// come back: the window must reach past one tenant's backlog to
		// the next tenant's call.
		pending = ExecuteMaxAckPending
	}
	maxDeliver := o.MaxDeliver
	if stage == subjects.Audit {
		maxDeliver = max(maxDeliver, AuditMaxDeliver)
	}
	return jetstream.ConsumerConfig{
		Durable: in.Consumer, Description: "toolgate " + stage + " workers",
		FilterSubject: in.Filter, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: o.AckWait, MaxDeliver: maxDeliver, MaxAckPending: pending,
		Replicas: o.Replicas,
	}
}

// EnsureTopology creates the streams and stage consumers that are missing.
// Existing streams are left untouched, so a second process, or a restart,
// never resets them or undoes an operator's changes.
func EnsureTopology(ctx context.Context, js jetstream.JetStream, o TopologyOptions) error {
	set := o // the byte limits left zero take their defaults, which may shrink
	o.defaults()
	streams := Streams(o)
	var missing []jetstream.StreamConfig
	for _, cfg := range streams {
		if st, err := js.Stream(ctx, cfg.Name); err == nil {
			// A results or audit stream made before direct gets were allowed
			// gets them, an invoke stream made with a duplicate window loses
			// it; nothing else of an existing stream changes.
			if have := st.CachedInfo().Config; cfg.AllowDirect && !have.AllowDirect {
				have.AllowDirect = true
				if _, err := js.UpdateStream(ctx, have); err != nil {
					return fmt.Errorf("allowing direct gets on %s: %w", cfg.Name, err)
				}
			}
			if have := st.CachedInfo().Config; cfg.Name == subjects.StreamInvoke && have.Duplicates != 0 {
				have.Sources, have.Duplicates = cfg.Sources, 0
				if _, err := js.UpdateStream(ctx, have); err != nil {
					return fmt.Errorf("ending the duplicate window of %s: %w", cfg.Name, err)
				}
			}
			continue
		} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("looking up stream %s: %w", cfg.Name, err)
		}
		missing = append(missing, cfg)
	}
	fitRoom(missing, set)
	for _, cfg := range missing {
		if err := createStream(ctx, js, cfg); err != nil {
			return err
		}
	}
	// The audit archive's default bucket, append-only (docs/audit.md).
	if err := archivestore.NewNATS(js, subjects.BucketAuditArchive).EnsureBucket(ctx, o.Replicas, o.Storage); err != nil {
		return fmt.Errorf("creating the audit archive bucket: %w", err)
	}
	for _, stage := range subjects.Stages {
		for _, in := range ConsumedBy(stage) {
			if _, err := js.Consumer(ctx, in.Stream, in.Consumer); err == nil {
				continue
			} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return fmt.Errorf("looking up consumer %s: %w", in.Consumer, err)
			}
			_, err := js.CreateConsumer(ctx, in.Stream, ConsumerConfig(stage, in, o))
			if err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
				return fmt.Errorf("creating consumer %s: %w", in.Consumer, err)
			}
		}
	}
	// The SIEM export's own reader of AUDIT: never gives up on an event
	// (an endpoint down for a day holds its events, which AUDIT keeps).
	in := subjects.AuditOTLPInput
	if _, err := js.Consumer(ctx, in.Stream, in.Consumer); errors.Is(err, jetstream.ErrConsumerNotFound) {
		_, err := js.CreateConsumer(ctx, in.Stream, jetstream.ConsumerConfig{Durable: in.Consumer,
			Description: "toolgate audit events to OTLP (serve --audit-otlp)", FilterSubject: in.Filter,
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: o.AckWait, MaxDeliver: -1, MaxAckPending: o.MaxAckPending,
			Replicas: o.Replicas})
		if err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
			return fmt.Errorf("creating consumer %s: %w", in.Consumer, err)
		}
	} else if err != nil {
		return fmt.Errorf("looking up consumer %s: %w", in.Consumer, err)
	}
	return nil
}

// EnsureSites creates the execute consumers of sites that are missing:
// each site's worker pulls from its own (subjects.SiteInputs), and a
// site's calls wait there, in the hub's pipeline, while its link is down.
func EnsureSites(ctx context.Context, js jetstream.JetStream, o TopologyOptions, sites []string) error {
	o.defaults()
	for _, site := range sites {
		// Its outbox: bounded on its own, discarding new messages when full.
		out := subjects.SiteForward(site)
		if _, err := js.Stream(ctx, out.Stream); errors.Is(err, jetstream.ErrStreamNotFound) {
			err = createStream(ctx, js, jetstream.StreamConfig{
				Name: out.Stream, Description: "what site " + site + " sends the hub, until the hub forwards it",
				Subjects: []string{subjects.SiteOutbox(site)}, Retention: jetstream.WorkQueuePolicy,
				MaxMsgs: o.SiteOutboxMsgs, MaxBytes: o.SiteOutboxBytes, MaxAge: o.PipelineMaxAge, Discard: jetstream.DiscardNew,
				Duplicates: o.Duplicates, Replicas: o.Replicas, Storage: o.Storage,
			})
			if err != nil {
				return err
			}
		} else if err != nil {
			return fmt.Errorf("looking up stream %s: %w", out.Stream, err)
		}
		if _, err := js.Consumer(ctx, out.Stream, out.Consumer); errors.Is(err, jetstream.ErrConsumerNotFound) {
			_, err = js.CreateConsumer(ctx, out.Stream, jetstream.ConsumerConfig{
				Durable: out.Consumer, Description: "the hub forwarding site " + site + "'s messages",
				FilterSubject: out.Filter, AckPolicy: jetstream.AckExplicitPolicy, AckWait: o.AckWait,
				MaxAckPending: o.MaxAckPending, Replicas: o.Replicas,
			})
			if err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
				return fmt.Errorf("creating consumer %s of %s: %w", out.Consumer, out.Stream, err)
			}
		} else if err != nil {
			return fmt.Errorf("looking up consumer %s of %s: %w", out.Consumer, out.Stream, err)
		}
		for _, in := range subjects.SiteInputs(site) {
			if _, err := js.Consumer(ctx, in.Stream, in.Consumer); err == nil {
				continue
			} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return fmt.Errorf("looking up consumer %s: %w", in.Consumer, err)
			}
			cfg := ConsumerConfig(subjects.Execute, in, o)
			cfg.Description = "toolgate execute workers at site " + site
			if _, err := js.CreateConsumer(ctx, in.Stream, cfg); err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
				return fmt.Errorf("creating consumer %s: %w", in.Consumer, err)
			}
		}
	}
	return nil
}

// KeepsInvocations reports whether the invoke stream keeps each message
// until its call ends (MemoryHops) rather than until validate takes it.
func KeepsInvocations(ctx context.Context, js jetstream.JetStream) (bool, error) {
	st, err := js.Stream(ctx, subjects.StreamInvoke)
	if err != nil {
		return false, err
	}
	return st.CachedInfo().Config.Retention == jetstream.LimitsPolicy, nil
}

// Redrive sends every message the invoke stream still holds to validate
// again, when it keeps them (MemoryHops): after a restart of the server
// that emptied the hops in memory, each call not yet ended is taken up
// again from its ingest. It is safe for a call still under way: a hop's
// message id derives from the ingest sequence (a second copy within the
// duplicate window is dropped), execute's durable claim keeps a tool from
// running twice (an interrupted non-idempotent run ends E3023) and audit
// keeps the first ending. It reports whether it re-drove.
func Redrive(ctx context.Context, js jetstream.JetStream) (bool, error) {
	keeps, err := KeepsInvocations(ctx, js)
	if err != nil || !keeps {
		return false, err
	}
	for _, in := range subjects.Inputs(subjects.Validate) {
		if in.Stream != subjects.StreamInvoke {
			continue
		}
		if _, err := js.ResetConsumerToSequence(ctx, in.Stream, in.Consumer, 1); err != nil {
			return false, fmt.Errorf("re-driving %s from its first message: %w", in.Consumer, err)
		}
	}
	return true, nil
}

// ConsumedBy are the durable consumers stage's workers read: its inputs,
// and for audit the relay.
func ConsumedBy(stage string) []subjects.Input {
	in := subjects.Inputs(stage)
	if stage == subjects.Audit {
		in = append(in, subjects.RelayInput)
	}
	return in
}

// Bind checks that the streams and consumers a role uses are there (the
// operator creates them); it creates nothing.
func Bind(ctx context.Context, js jetstream.JetStream, inputs []subjects.Input) error {
	for _, in := range inputs {
		if _, err := js.Consumer(ctx, in.Stream, in.Consumer); err != nil {
			return fmt.Errorf("looking up consumer %s of stream %s: %w", in.Consumer, in.Stream, err)
		}
	}
	return nil
}

// Retry runs fn until it succeeds or ctx is done, waiting between attempts
// with exponential backoff and full jitter (100 ms doubling to 5 s) and
// logging each failure. Start-up uses it: processes started together
// against a fresh cluster find streams, consumers and their leaders
// missing for a while, which is a race to wait out, not a reason to exit.
func Retry(ctx context.Context, log *slog.Logger, what string, fn func(ctx context.Context) error) error {
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		}
		wait := backoff.FullJitter(attempt, 100*time.Millisecond, 5*time.Second)
		log.Warn(what+": retrying", "attempt", attempt, "retry_in", wait.Round(time.Millisecond), "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}
