// Package stages holds the contract every pipeline stage implements. The one
// Runner that does all NATS I/O for them is internal/runner.
//
// A stage is pure logic: it receives an Invocation and decides. The Runner
// consumes the stage's durable pull consumer, decodes, calls the stage, and
// then settles the message from the stage's answer:
//
//   - nil error and the invocation not terminal: the invocation goes to the
//     next stage's subject.
//   - nil error and the invocation terminal (the stage called Fail or
//     Succeed), or any error that is not Transient: the invocation goes
//     straight to audit, which finalises it.
//   - a Transient error: the message is redelivered after a delay, until the
//     consumer's delivery limit; on the last delivery the invocation ends
//     with internal_error (E3901) instead, so it is never lost.
//   - a panic in the stage: internal_error (E3902), to audit.
//
// Two kinds of stage change what the Runner does, by implementing an optional
// interface beside Stage: a Decoder reads raw messages from the bus itself
// (the first stage, whose input is the caller's CloudEvent rather than an
// envelope handed on by a stage), and a Finaliser ends invocations instead of
// handing them on (the last stage). See Decoder and Finaliser.
//
// Outputs a stage returns (audit events, results) are published before the
// successor (or earlier, while the stage works, when it calls Announce), and
// the successor before the input is acked. Every publish
// carries a message id derived from the ingest sequence and the hop, so a
// redelivered input never duplicates what its first delivery published.
package stages

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/toolgate/toolgate/internal/envelope"
)

// Stage is one step of the pipeline.
//
// Process may modify inv: record decisions, call inv.Fail to end it, or
// inv.Succeed. It must not do NATS messaging itself (return Outputs, or
// Announce them through the Runner),
// must honour ctx, and must be safe for concurrent use: the Runner calls it
// from several workers at once. Process is called at least once per
// invocation: a redelivery after a crash calls it again.
type Stage interface {
	Process(ctx context.Context, inv *envelope.Invocation) ([]Output, error)
}

// Decoder is a Stage that decodes the messages it consumes itself. Without
// it the Runner reads each message as the JSON envelope one stage hands the
// next, and a message that does not decode so is poison.
//
// Decode turns the message on subject, with header and body data, at stream
// sequence seq and received at now, into an invocation. A nil invocation
// means the message is not an invocation at all: the Runner records it as
// poison on the audit stream and terminates it. An invocation with a non-nil
// error is one that must end with that error: the Runner fails it and sends
// it to audit without calling Process. Decode must be safe for concurrent
// use and do no I/O; it is also called on a message that ran out of
// deliveries, to end it with an audit event.
type Decoder interface {
	Stage
	Decode(subject string, header map[string][]string, data []byte, seq uint64, now time.Time) (*envelope.Invocation, error)
}

// Finaliser is a Stage that ends every invocation it processes: the Runner
// never hands its input on. For a Finaliser the Runner acks the input when
// Process returns nil; it terminates it (no redelivery) when Process returns
// an error that is not Transient, or a Transient one on the last delivery;
// and a message that runs out of deliveries is recorded as poison, since no
// stage is left to end it. Finalises is a marker: the Runner never calls it.
type Finaliser interface {
	Stage
	Finalises()
}

// Announce asks the Runner to publish outs now, while the stage is still
// working, instead of after Process returns: for events a watcher must see
// as they happen (tool.invoked before the tool runs). The Runner sends them
// at once with their message ids and does not wait: their acknowledgements
// are awaited with the outputs', before the input is acked, and a failed
// one puts the input back, so a redelivery announces again and is
// deduplicated like any output. Announce returns an error when a publish
// could not be sent or ctx does not come from a Runner; a stage that needs
// the event delivered then returns it among its outputs as well, under the
// same id.
func Announce(ctx context.Context, outs ...Output) error {
	pub, ok := ctx.Value(announceKey{}).(func(context.Context, Output) error)
	if !ok {
		return ErrNoAnnouncer
	}
	for _, o := range outs {
		if err := pub(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

type announceKey struct{}

// Pending is an announcement AnnounceAfter has not made yet.
type Pending struct {
	mu    sync.Mutex
	timer *time.Timer
	done  bool // announced, or withdrawn
	sent  bool // announced, and handed to the Runner
}

// AnnounceAfter announces out (Announce) once the stage has worked for
// grace, unless Withdraw comes first. An event saying work has started
// (tool.invoked) earns a message of its own only while the work is under
// way; a stage whose work ends sooner carries the event with the
// invocation to audit instead, saving a durable write per call.
func AnnounceAfter(ctx context.Context, grace time.Duration, out Output) *Pending {
	return AnnounceAfterFunc(ctx, grace, nil, out)
}

// AnnounceAfterFunc is AnnounceAfter that calls first, when not nil, just
// before it announces: what the event tells of must be recorded by the
// time it is read (execute's running status, before its tool.invoked).
// Withdraw waits for first as for the announcement.
func AnnounceAfterFunc(ctx context.Context, grace time.Duration, first func(), out Output) *Pending {
	p := &Pending{}
	p.timer = time.AfterFunc(grace, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.done {
			p.done = true
			if first != nil {
				first()
			}
			p.sent = Announce(ctx, out) == nil
		}
	})
	return p
}

// Withdraw stops the announcement if it has not been made, waiting for one
// under way, and reports whether the stage must deliver the event itself:
// it was not announced, or announcing it failed. The stage calls it before
// Process returns.
func (p *Pending) Withdraw() bool {
	p.timer.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = true
	return !p.sent
}

// ErrNoAnnouncer is Announce's error outside a Runner.
var ErrNoAnnouncer = errors.New("no runner to announce through")

// WithAnnounce makes Announce on ctx publish through pub; the runner calls
// it, stages never do.
func WithAnnounce(ctx context.Context, pub func(context.Context, Output) error) context.Context {
	return context.WithValue(ctx, announceKey{}, pub)
}

// Output is a message a stage asks the Runner to publish to a stream.
type Output struct {
	Subject string
	// MsgID deduplicates the publish; stages derive it from the invocation so
	// a redelivered input produces the same ids.
	MsgID  string
	Header map[string][]string
	Data   []byte
}

// transient marks an error as worth retrying later.
type transient struct {
	err   error
	delay time.Duration
}

func (t *transient) Error() string { return t.err.Error() }
func (t *transient) Unwrap() error { return t.err }

// Transient marks err as a passing failure (a store unavailable, a publish
// timed out): the Runner redelivers the input after delay instead of ending
// the invocation. A zero delay uses the Runner's backoff.
func Transient(err error, delay time.Duration) error {
	if err == nil {
		return nil
	}
	return &transient{err: err, delay: delay}
}

// IsTransient reports whether err was marked Transient, and its delay.
func IsTransient(err error) (time.Duration, bool) {
	if err == nil {
		return 0, false
	}
	var t *transient
	if errors.As(err, &t) {
		return t.delay, true
	}
	return 0, false
}

// ErrOverQuota matches the Transient error of a call put back because its
// tenant has its quota of calls in flight: it is not a failure, and the
// Runner logs it quietly.
var ErrOverQuota = errors.New("the tenant has its quota of calls in flight")

// receivedKey holds the received message's facts on a context.
type receivedKey struct{}

// received is the message being processed, as a context: its delivery and
// the consumer's limit, which stored message it is, and what Announce
// publishes through. The Runner adds it to each message's context at
// once, one allocation a hop.
type received struct {
	context.Context
	delivered, max int
	stream         string
	seq            uint64
	size           int
	announce       func(context.Context, Output) error // nil: the parent's
}

// Value answers for both keys a received records; any other goes to the
// parent, as context.WithValue's would.
func (m *received) Value(key any) any {
	switch key.(type) {
	case receivedKey:
		return m
	case announceKey:
		if m.announce != nil {
			return m.announce
		}
	}
	return m.Context.Value(key)
}

// receivedOf is what ctx records of the message, to derive a new one from.
func receivedOf(ctx context.Context) received {
	m, _ := ctx.Value(receivedKey{}).(*received)
	if m == nil {
		return received{}
	}
	return *m
}

// derive is m recorded on ctx, with Announce left to ctx.
func (m received) derive(ctx context.Context) context.Context {
	m.Context, m.announce = ctx, nil
	return &m
}

// WithMessage records on ctx what WithDelivery and WithInput record and,
// when pub is not nil, what WithAnnounce records, in one value; the Runner
// calls it.
func WithMessage(ctx context.Context, delivered, max int, stream string, seq uint64, size int,
	pub func(context.Context, Output) error) context.Context {
	return &received{Context: ctx, delivered: delivered, max: max, stream: stream, seq: seq, size: size, announce: pub}
}

// WithDelivery records on ctx that the message being processed is delivery
// number delivered of at most max (0: no limit).
func WithDelivery(ctx context.Context, delivered, max int) context.Context {
	m := receivedOf(ctx)
	m.delivered, m.max = delivered, max
	return m.derive(ctx)
}

// Delivery returns the delivery number of the message being processed and
// the consumer's limit, or 0, 0 outside a Runner. A stage that puts a call
// back for a reason other than failure (a tenant's quota) uses it to stop
// before the limit would end the call.
func Delivery(ctx context.Context) (delivered, max int) {
	m := receivedOf(ctx)
	return m.delivered, m.max
}

// WithInput records on ctx which stored message is being processed: its
// stream and stream sequence, the same on every redelivery, and its size
// in bytes.
func WithInput(ctx context.Context, stream string, seq uint64, size int) context.Context {
	m := receivedOf(ctx)
	m.stream, m.seq, m.size = stream, seq, size
	return m.derive(ctx)
}

// Input names the stored message being processed ("STREAM:seq"), or ""
// outside a Runner. A finaliser records it with the ending it writes, so
// that a redelivery of that message is told from a second message that
// tries to end the same invocation.
func Input(ctx context.Context) string {
	m := receivedOf(ctx)
	if m.stream == "" {
		return ""
	}
	return m.stream + ":" + strconv.FormatUint(m.seq, 10)
}

// InputSize is the size of the message being processed (its data), or 0
// outside a Runner.
func InputSize(ctx context.Context) int {
	return receivedOf(ctx).size
}

// Gate is implemented by a stage that can put a message back before it is
// decoded: the Runner asks Defer for every message it fetches and, when it
// answers true, naks the message with that delay without handing it to a
// worker. Defer must be cheap and must not block; it sees only the subject
// and the delivery count (as in Delivery). Process still decides: Defer is
// a hint that keeps a backlog from occupying workers.
type Gate interface {
	Defer(subject string, delivered, max int) (time.Duration, bool)
}
