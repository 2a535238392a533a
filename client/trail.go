package client

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// trailPoll is how often a direct read of the trail that has caught up
// asks for newer events.
const trailPoll = 200 * time.Millisecond

// consumerRefused reports whether the bus refused the consumer that
// ended ctx: a person's credentials (approver, auditor) read the trail by
// direct gets and may create no consumer, whose deliver subject JetStream
// does not check (docs/security.md).
func consumerRefused(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), &api.Error{Code: api.PermissionDenied, ECode: api.EBusNotPermitted})
}

// tailDirect is Tail without a consumer: AUDIT's messages on filter one by
// one, by direct gets of the next sequence on the subject, from the first
// when all is set, else from the next one stored; caught up, it asks again
// every trailPoll until ctx ends or fn returns an error.
func (c *Operator) tailDirect(ctx context.Context, filter string, all bool, fn func(seq uint64, subject string, data []byte) error) error {
	st, err := c.js.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		return err
	}
	seq := uint64(1)
	if !all {
		seq = st.CachedInfo().State.LastSeq + 1
	}
	for {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(trailPoll):
			}
			continue
		case err != nil:
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if err := fn(m.Sequence, m.Subject, m.Data); err != nil {
			return err
		}
		seq = m.Sequence + 1
	}
}
