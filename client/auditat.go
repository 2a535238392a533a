package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/subjects"
)

// ErrNoAuditEvent: the AUDIT stream holds no audit event at that sequence
// (never, or no longer).
var ErrNoAuditEvent = errors.New("no audit event stored at that sequence")

// AuditAt reads the audit event stored at seq in the AUDIT stream (the
// sequence TailSeq and TailLastSeq hand over). It reads with an ordered
// consumer, as Tail does, so it needs no right beyond Tail's.
func (c *Operator) AuditAt(ctx context.Context, seq uint64) (subject string, data []byte, err error) {
	if seq == 0 {
		return "", nil, ErrNoAuditEvent
	}
	jsCtx, done := c.refusals.track(ctx, "$JS.API.>")
	defer done()
	st, err := c.js.Stream(jsCtx, subjects.StreamAudit)
	if err != nil {
		return "", nil, refusedOr(jsCtx, fmt.Errorf("reading audit: %w", err))
	}
	// Past the end the consumer would wait for the next event instead.
	if s := st.CachedInfo().State; seq < s.FirstSeq || seq > s.LastSeq {
		return "", nil, ErrNoAuditEvent
	}
	cons, err := c.js.OrderedConsumer(jsCtx, subjects.StreamAudit, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subjects.AuditAll}, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: seq})
	if err != nil {
		return "", nil, refusedOr(jsCtx, fmt.Errorf("reading audit: %w", err))
	}
	wait := 5 * time.Second
	if d, ok := ctx.Deadline(); ok {
		wait = max(time.Until(d), time.Millisecond)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(wait))
	if err != nil {
		return "", nil, refusedOr(jsCtx, fmt.Errorf("reading audit: %w", err))
	}
	// The first event at or after seq: another one when seq itself was
	// deleted.
	md, err := msg.Metadata()
	if err != nil {
		return "", nil, err
	}
	if md.Sequence.Stream != seq {
		return "", nil, ErrNoAuditEvent
	}
	return msg.Subject(), msg.Data(), nil
}
