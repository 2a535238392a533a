package runner

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// EndWaiting ends each call waiting in stream on filter (a removed site's
// subjects: no worker will ever take them) with e, as this stage's ending
// handed to audit, and deletes its message; what it cannot read it records
// as poison and deletes. It reads the stream by subject, not through a
// consumer (a work queue takes no second one on those subjects), so that
// the calls a worker took and never settled end too; it reads with read
// (the operator's) and ends and deletes with the stage's own rights. It
// returns how many calls it ended.
func (r *Runner) EndWaiting(ctx context.Context, read jetstream.JetStream, stream, filter string, e *api.Error) (int, error) {
	src, err := read.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	s, err := r.JS.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	ended := 0
	for seq := uint64(1); ; {
		// The next message on filter from seq on.
		raw, err := src.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return ended, nil
		}
		if err != nil {
			return ended, err
		}
		seq = raw.Sequence + 1
		o, err := poisonEvent(r.Name, raw.Subject, stream, raw.Sequence, errors.New("waited for a site since removed"))
		if inv, _ := r.decode(raw.Subject, raw.Header, raw.Data, raw.Sequence); inv != nil {
			if !inv.Terminal() {
				inv.Fail(r.Name, e)
			}
			o, err = r.handoff(inv, subjects.Audit)
			ended++
		}
		if err == nil {
			err = r.publish(ctx, o)
		}
		if err != nil {
			return ended, fmt.Errorf("ending message %d: %w", raw.Sequence, err)
		}
		if err := r.deleteLeftover(ctx, s, stream, raw.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return ended, fmt.Errorf("deleting message %d: %w", raw.Sequence, err)
		}
	}
}
