package auditchain

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/subjects"
)

// Event is one message of AUDIT.
type Event struct {
	Seq     uint64
	Subject string
	Data    []byte
	Time    time.Time
	// Header is the message's header, where the reader has it (the
	// checkpointer's reads; HeaderEventMAC is there).
	Header nats.Header
	// Proof is the event's inclusion proof in its checkpoint, as an
	// export carries it (nil from the bus).
	Proof []Hash
}

// Stored is one message of the checkpoint stream: its checkpoint, or why
// it is not one.
type Stored struct {
	Seq        uint64
	Checkpoint *Checkpoint
	Err        error
}

// StreamState is what Verify needs to know of AUDIT as it is now.
type StreamState struct {
	// Exists is false when there is no AUDIT stream.
	Exists      bool
	Created     string // RFC 3339, as checkpoints record it
	First, Last uint64
	MaxAge      time.Duration
	// ChainFirst is the first sequence of the checkpoint stream.
	ChainFirst uint64
	// Tenant, when set, says the events are only this tenant's (an
	// export of one tenant): the others' are not missing.
	Tenant string
	// From and To bound the sequences whose events the source holds (an
	// export's window; 0: no bound).
	From, To uint64
}

// Source is where Verify reads the trail: the bus, or an export file.
type Source interface {
	State(ctx context.Context) (StreamState, error)
	// Checkpoints are the chain's messages in order.
	Checkpoints(ctx context.Context) ([]Stored, error)
	// Events calls fn with each event stored at first..last, in order.
	Events(ctx context.Context, first, last uint64, fn func(Event) error) error
}

// Bus reads the trail from JetStream: with ordered consumers on AUDIT and
// AUDIT_CHAIN where the credentials may make them (the operator's), else
// with batched direct gets, which is all a person's credentials
// (auditor, approver) may do: a consumer's deliver subject is not checked
// against its creator's rights, so no one else may create one.
type Bus struct {
	JS jetstream.JetStream
	// NoConsumers reads by direct gets at once, for credentials known to
	// create none (control's): trying first would wait consumerWait.
	NoConsumers bool
}

// State implements Source.
func (b Bus) State(ctx context.Context) (StreamState, error) {
	var s StreamState
	chain, err := b.JS.Stream(ctx, subjects.StreamAuditChain)
	if err != nil {
		return s, fmt.Errorf("checkpoint stream: %w", err)
	}
	s.ChainFirst = chain.CachedInfo().State.FirstSeq
	st, err := b.JS.Stream(ctx, subjects.StreamAudit)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("audit stream: %w", err)
	}
	info := st.CachedInfo()
	s.Exists, s.Created = true, info.Created.UTC().Format(time.RFC3339Nano)
	s.First, s.Last, s.MaxAge = info.State.FirstSeq, info.State.LastSeq, info.Config.MaxAge
	return s, nil
}

// Checkpoints implements Source.
func (b Bus) Checkpoints(ctx context.Context) ([]Stored, error) {
	var out []Stored
	err := scan(ctx, b.JS, subjects.StreamAuditChain, 1, 0, b.NoConsumers, func(e Event) error {
		cp, err := DecodeCheckpoint(e.Data)
		out = append(out, Stored{Seq: e.Seq, Checkpoint: cp, Err: err})
		return nil
	})
	return out, err
}

// Events implements Source.
func (b Bus) Events(ctx context.Context, first, last uint64, fn func(Event) error) error {
	return scan(ctx, b.JS, subjects.StreamAudit, first, last, b.NoConsumers, fn)
}

// FirstAt is the first sequence of AUDIT stored at or after t (0: none).
func (b Bus) FirstAt(ctx context.Context, t time.Time) (uint64, error) {
	cctx, cancel := context.WithTimeout(ctx, consumerWait)
	c, err := b.JS.OrderedConsumer(cctx, subjects.StreamAudit, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &t})
	cancel()
	if err != nil && ctx.Err() == nil {
		return directFirstAt(ctx, b.JS.Conn(), subjects.StreamAudit, t)
	}
	if err != nil {
		return 0, err
	}
	m, err := c.Next(jetstream.FetchMaxWait(2 * time.Second))
	if errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoMessages) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	md, err := m.Metadata()
	if err != nil {
		return 0, err
	}
	return md.Sequence.Stream, nil
}

// readEach calls fn with each message of st at first..last, in order,
// read one by one from the stream's leader; sequences that hold none are
// skipped.
func readEach(ctx context.Context, st jetstream.Stream, first, last uint64, fn func(Event) error) error {
	for seq := first; seq <= last; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if err := fn(Event{Seq: m.Sequence, Subject: m.Subject, Data: m.Data, Time: m.Time, Header: m.Header}); err != nil {
			return err
		}
	}
	return nil
}

// scan reads stream's messages from first to last (0: to the end as it
// is now) with an ordered consumer.
// errNoConsumer stands for a consumer not tried (Bus.NoConsumers).
var errNoConsumer = errors.New("reading without a consumer")

func scan(ctx context.Context, js jetstream.JetStream, stream string, first, last uint64, noConsumer bool, fn func(Event) error) error {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	end := st.CachedInfo().State.LastSeq
	if last == 0 || last > end {
		last = end
	}
	if first == 0 {
		first = 1
	}
	if first > last || st.CachedInfo().State.Msgs == 0 {
		return nil
	}
	var c jetstream.Consumer
	err = errNoConsumer
	if !noConsumer {
		cctx, cancel := context.WithTimeout(ctx, consumerWait)
		c, err = js.OrderedConsumer(cctx, stream, jetstream.OrderedConsumerConfig{
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: first})
		cancel()
	}
	if err != nil && ctx.Err() == nil {
		// Credentials that may create no consumer (a person's) read by
		// direct gets, or message by message where the stream takes none.
		if st.CachedInfo().Config.AllowDirect {
			return readDirect(ctx, js.Conn(), stream, first, last, fn)
		}
		return readEach(ctx, st, first, last, fn)
	}
	if err != nil {
		return err
	}
	for {
		batch, err := c.Fetch(500, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return err
			}
			if md.Sequence.Stream > last {
				return nil
			}
			if err := fn(Event{Seq: md.Sequence.Stream, Subject: m.Subject(), Data: m.Data(), Time: md.Timestamp}); err != nil {
				return err
			}
			if md.Sequence.Stream == last || md.NumPending == 0 {
				return nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return err
		}
		if got == 0 || ctx.Err() != nil {
			return ctx.Err()
		}
	}
}
