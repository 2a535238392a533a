package topology

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/backoff"
	"github.com/toolgate/toolgate/subjects"
)

// TopologyOptions shape streams and consumers when EnsureTopology creates them.
type TopologyOptions struct {
	Replicas int
	Storage  jetstream.StorageType
	// AckWait and MaxDeliver apply to every stage consumer; defaults 30s and 5.
	AckWait    time.Duration
	MaxDeliver int
	// ResultTTL bounds how long results are kept (default 24h); AuditMaxAge
	// how long audit events are (default: forever).
	ResultTTL   time.Duration
	AuditMaxAge time.Duration
	// Duplicates is the dedup window of the streams (default 2m; for the
	// invoke stream InvokeDuplicates unless set).
	Duplicates time.Duration
}

func (o *TopologyOptions) defaults() {
	if o.Replicas < 1 {
		o.Replicas = 1
	}
	if o.AckWait == 0 {
		o.AckWait = 30 * time.Second
	}
	if o.MaxDeliver == 0 {
		o.MaxDeliver = 5
	}
	if o.ResultTTL == 0 {
		o.ResultTTL = 24 * time.Hour
	}
	if o.Duplicates == 0 {
		o.Duplicates = 2 * time.Minute
	}
}

// InvokeDuplicates is the invoke stream's default dedup window, the
// server's minimum. JetStream deduplicates by Nats-Msg-Id across the whole
// stream, and the invoke stream holds every tenant: two tenants that send the
// same Nats-Msg-Id (any client may set it) would lose one event silently, and
// JetStream offers no per-subject window. So deduplication of invocations is
// the validate stage's, per tenant: it claims (tenant, invocation id) in KV
// with the ingest sequence and a digest of the request, and a repeat ends
// with E3024 and no second result. The stream's window is kept at its floor
// so it can rarely act across tenants; ids toolgate derives are scoped by
// tenant (invocation.InvokeMsgID) so they never collide at all.
const InvokeDuplicates = 100 * time.Millisecond

// Streams returns the configuration of toolgate's streams.
func Streams(o TopologyOptions) []jetstream.StreamConfig {
	invokeWindow := cmp.Or(o.Duplicates, InvokeDuplicates)
	o.defaults()
	return []jetstream.StreamConfig{{
		Name: subjects.StreamInvoke, Description: "tool.invoke CloudEvents awaiting validation",
		Subjects: []string{subjects.InvokeAll}, Retention: jetstream.WorkQueuePolicy,
		Duplicates: invokeWindow, Replicas: o.Replicas, Storage: o.Storage,
	}, {
		Name: subjects.StreamPipeline, Description: "invocations handed from stage to stage",
		Subjects: []string{subjects.PipeAll}, Retention: jetstream.WorkQueuePolicy,
		Duplicates: o.Duplicates, Replicas: o.Replicas, Storage: o.Storage,
	}, {
		Name: subjects.StreamResults, Description: "one ToolInvokeResponse per invocation",
		Subjects: []string{subjects.ResultAll}, Retention: jetstream.LimitsPolicy, MaxAge: o.ResultTTL,
		Duplicates: o.Duplicates, Replicas: o.Replicas, Storage: o.Storage,
	}, {
		Name: subjects.StreamAudit, Description: "toolgate audit trail (append-only)",
		Subjects: []string{subjects.AuditAll}, Retention: jetstream.LimitsPolicy, MaxAge: o.AuditMaxAge,
		DenyDelete: true, DenyPurge: true,
		Duplicates: o.Duplicates, Replicas: o.Replicas, Storage: o.Storage,
	}}
}

// ExecuteMaxAckPending is the execute consumers' window of unacknowledged
// messages (other stages: 1000).
const ExecuteMaxAckPending = 20000

// ConsumerConfig is the durable pull consumer of one input of stage.
func ConsumerConfig(stage string, in subjects.Input, o TopologyOptions) jetstream.ConsumerConfig {
	o.defaults()
	pending := 1000
	if stage == subjects.Execute {
		// Calls put back for their tenant's quota stay pending until they
		// come back: the window must reach past one tenant's backlog to
		// the next tenant's call.
		pending = ExecuteMaxAckPending
	}
	return jetstream.ConsumerConfig{
		Durable: in.Consumer, Description: "toolgate " + stage + " workers",
		FilterSubject: in.Filter, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: o.AckWait, MaxDeliver: o.MaxDeliver, MaxAckPending: pending,
		Replicas: o.Replicas,
	}
}

// EnsureTopology creates the streams and stage consumers that are missing.
// Existing streams are left untouched, so a second process, or a restart,
// never resets them or undoes an operator's changes.
func EnsureTopology(ctx context.Context, js jetstream.JetStream, o TopologyOptions) error {
	for _, cfg := range Streams(o) {
		if _, err := js.Stream(ctx, cfg.Name); err == nil {
			continue
		} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("looking up stream %s: %w", cfg.Name, err)
		}
		_, err := js.CreateStream(ctx, cfg)
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("creating stream %s: %w", cfg.Name, err)
		}
	}
	for _, stage := range subjects.Stages {
		for _, in := range subjects.Inputs(stage) {
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
