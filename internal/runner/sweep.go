package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/subjects"
)

// DefaultSweepEvery is how often a Runner looks for messages its consumers
// passed over without settling them (Runner.SweepEvery).
const DefaultSweepEvery = time.Minute

// sweepBatch bounds the messages one sweep of one consumer looks at.
const sweepBatch = 1000

// scanLimit bounds the pipeline messages one sweep reads to learn where
// invocations are now; past it, what it could not place is left for later.
const scanLimit = 200_000

// deleteTimeout bounds one delete request: a request the bus refuses for
// want of a right gets no reply at all, only the connection's error.
const deleteTimeout = 2 * time.Second

// deleteAttempts is how often a sweep tries to delete one message before it
// leaves it for the next sweep.
const deleteAttempts = 3

// Records reads invocations' status records (*kvstore.Store); the sweep
// decides from them what a message left in a work queue is.
type Records interface {
	Status(ctx context.Context, tenant, id string) (api.Record, error)
}

// ErrDeleteRefused reports that the bus refused to delete a message: the
// process's credentials lack $JS.API.STREAM.MSG.DELETE for the stream.
var ErrDeleteRefused = errors.New("deleting a message was refused by the bus")

// Sweep outcomes (toolgate_sweep_messages_total).
const (
	sweptDeleted = "deleted" // a leftover of an invocation that ended or moved on: deleted, nothing else
	sweptEnded   = "ended"   // stuck at this hop: ended (E3901 to audit, or poison at audit)
	sweptHeld    = "held"    // its invocation is parked or running: left alone this sweep
)

// sweep settles, every SweepEvery, the messages the stage's consumers left
// in their work-queue stream without anything pending on them. Two kinds
// look alike there: a message that reached the delivery limit and whose one
// advisory nobody acted on (the process that took it died, or none was
// listening), and an acknowledged message JetStream kept after a hard kill
// of the server (nats-server #5148, #5227). Only the first may end its
// invocation; the second must go without a trace. The consumer cannot tell
// them apart, the invocation can: see classify.
//
// A consumer's snapshot (one info call) finds such messages: every message
// still in the stream at or below the last sequence the consumer delivered
// is either pending (counted in NumAckPending, including those waiting for
// redelivery) or left behind. So when nothing is pending, every such
// message is left behind; and any at or below the ack floor is, whatever is
// pending. A busy consumer is swept when it next has nothing pending. A
// message is acted on only once two sweeps in a row found it, so an
// acknowledged message whose removal is still on its way through a cluster
// is not taken for a forgotten one.
//
// Every process of a stage sweeps; two that end the same message publish
// the same hand-off to audit under the same message id, which the stream
// keeps once, and past its duplicate window audit's first-ending-wins rule
// drops the second. The sweep stops as soon as ctx is done.
func (r *Runner) sweep(ctx context.Context) {
	every := r.SweepEvery
	if every < 0 || r.Records == nil || r.NoSettle {
		return
	}
	if every == 0 {
		every = DefaultSweepEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	seen := map[string]map[uint64]bool{} // consumer → sequences left behind last time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		ins := r.inputs()
		if r.SweepAlso != nil {
			ins = append(slices.Clone(ins), r.SweepAlso()...)
		}
		for _, in := range ins {
			below, err := r.leftBehind(ctx, in)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				r.Log.Warn("sweeping for unsettled messages", "consumer", in.Consumer, "err", err)
				continue // keep what the last sweep saw
			}
			now := make(map[uint64]bool, len(below))
			var confirmed []uint64
			for _, seq := range below {
				if seen[in.Consumer][seq] {
					confirmed = append(confirmed, seq)
				} else {
					now[seq] = true // first sighting: confirm next time
				}
			}
			for _, seq := range r.settleLeftovers(ctx, in, confirmed) {
				now[seq] = true // not settled: try again next sweep
			}
			if ctx.Err() != nil {
				return
			}
			seen[in.Consumer] = now
		}
	}
}

// leftover is a message the sweep found, with its invocation (nil when it
// cannot be decoded).
type leftover struct {
	seq uint64
	inv *envelope.Invocation
}

// settleLeftovers deletes, ends or holds each of the messages seqs of in's
// stream (see classify) and returns those it could not settle.
func (r *Runner) settleLeftovers(ctx context.Context, in subjects.Input, seqs []uint64) (retry []uint64) {
	if len(seqs) == 0 {
		return nil
	}
	stream, err := r.JS.Stream(ctx, in.Stream)
	if err != nil {
		r.Log.Warn("sweeping: opening stream", "stream", in.Stream, "err", err)
		return seqs
	}
	var found []leftover
	for i, seq := range seqs {
		raw, err := stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // gone meanwhile
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.Log.Warn("sweeping: reading message", "stream", in.Stream, "seq", seq, "err", err)
			return append(retry, seqs[i:]...)
		}
		inv, _ := r.decode(raw.Subject, raw.Header, raw.Data, raw.Sequence)
		found = append(found, leftover{seq: seq, inv: inv})
	}
	var later map[string]uint64 // built once, when a record cannot decide alone
	refused := false            // a delete was refused: the rest would be too
	for _, l := range found {
		if ctx.Err() != nil {
			return nil
		}
		verdict, err := r.classify(ctx, in, l, &later)
		if err != nil {
			r.Log.Warn("sweeping: placing a leftover message", "consumer", in.Consumer, "seq", l.seq, "err", err)
			retry = append(retry, l.seq)
			continue
		}
		switch verdict {
		case sweptDeleted:
			if refused {
				retry = append(retry, l.seq)
				continue
			}
			err = r.deleteLeftover(ctx, stream, in.Stream, l.seq)
		case sweptEnded:
			r.Log.Warn("ending a message its consumer passed over without a settlement", "consumer", in.Consumer, "seq", l.seq)
			err = r.endExhausted(ctx, maxDeliveriesAdvisory{Stream: in.Stream, Consumer: in.Consumer,
				StreamSeq: l.seq, Deliveries: uint64(max(r.MaxDeliver, 0))}, true)
		case sweptHeld:
			retry = append(retry, l.seq) // looked at again until its invocation ends
		}
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			if ctx.Err() != nil {
				return nil
			}
			r.Log.Error("settling a leftover message", "consumer", in.Consumer, "seq", l.seq, "as", verdict, "err", err)
			refused = refused || errors.Is(err, ErrDeleteRefused)
			retry = append(retry, l.seq)
			continue
		}
		if r.Metrics != nil {
			r.Metrics.swept.WithLabelValues(r.Name, verdict).Inc()
		}
	}
	return retry
}

// classify tells what a message left behind at this hop is, from its
// invocation's status record and, when the record alone cannot say, from
// the messages of the invocation still in the pipeline:
//
//   - its invocation ended (terminal record), or belongs to an id another
//     publish holds, or has moved on (a newer message of it is in the
//     pipeline): a leftover of a settled message → deleted, nothing else;
//   - its invocation is parked for approval or running: a live worker
//     holds the record → held, never ended;
//   - otherwise it is stuck at this hop → ended; but a message the invoke
//     stream keeps until its call ends (Runner.KeptIngest) is held.
//
// The pipeline is read before the record is read again: a hop publishes its
// successor (at a higher sequence) before its input goes, so an invocation
// that moves on while the pipeline is read is found either there or, once
// it left the pipeline, in its record (running, parked, ended).
func (r *Runner) classify(ctx context.Context, in subjects.Input, l leftover, later *map[string]uint64) (string, error) {
	if l.inv == nil {
		return sweptEnded, nil // undecodable: recorded as poison
	}
	rec, err := r.record(ctx, l.inv)
	if err != nil {
		return "", err
	}
	if v, ok := byRecord(r.Name, l.inv, rec); ok {
		return v, nil
	}
	if r.KeptIngest && in.Stream == subjects.StreamInvoke {
		// A kept invocation stays until its call ends, as the re-drive
		// after a restart needs it, whatever hop the call is at.
		return sweptHeld, nil
	}
	if *later == nil {
		m, err := r.pipelineInvocations(ctx)
		if err != nil {
			return "", err
		}
		*later = m
	}
	if seq, ok := (*later)[invocationKey(l.inv)]; ok && (in.Stream != subjects.StreamPipeline || seq > l.seq) {
		return sweptDeleted, nil
	}
	if rec, err = r.record(ctx, l.inv); err != nil {
		return "", err
	}
	if v, ok := byRecord(r.Name, l.inv, rec); ok {
		return v, nil
	}
	switch rec.Status {
	case api.StatusPendingApproval, api.StatusRunning:
		return sweptHeld, nil
	}
	return sweptEnded, nil
}

// record is inv's status record; a missing one is a zero Record.
func (r *Runner) record(ctx context.Context, inv *envelope.Invocation) (api.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rec, err := r.Records.Status(ctx, inv.Tenant, inv.ID)
	if errors.Is(err, api.ErrInvocationNotFound) {
		return api.Record{}, nil
	}
	return rec, err
}

// byRecord is what the record alone says of a message of inv at stage: a
// verdict, or false when it needs the pipeline's view.
func byRecord(stage string, inv *envelope.Invocation, rec api.Record) (string, bool) {
	switch {
	case rec.InvocationID == "":
		// Validate makes the record before anything is handed on: at
		// validate the call was never taken; at a later hop its record
		// expired long after it ended.
		if stage == subjects.Validate {
			return sweptEnded, true
		}
		return sweptDeleted, true
	case rec.Seq != 0 && rec.Seq != inv.Event.Seq:
		// Another publish holds the id: this one was a repeat, which
		// ends without a status of its own.
		return sweptDeleted, true
	case rec.Status.Terminal():
		return sweptDeleted, true
	}
	return "", false
}

// invocationKey is what every pipeline message of one publish of an
// invocation shares: the start of its message id (envelope.Invocation.MsgID).
func invocationKey(inv *envelope.Invocation) string { return msgIDKey(inv.MsgID("")) }

func msgIDKey(id string) string {
	first := strings.IndexByte(id, '.')
	if first < 0 {
		return ""
	}
	second := strings.IndexByte(id[first+1:], '.')
	if second < 0 {
		return id
	}
	return id[:first+1+second]
}

// pipelineInvocations maps each invocation with a message in the pipeline
// stream to the highest sequence it has there.
func (r *Runner) pipelineInvocations(ctx context.Context) (map[string]uint64, error) {
	stream, err := r.JS.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		return nil, err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	last := info.State.LastSeq
	for seq, n := max(info.State.FirstSeq, 1), 0; seq <= last; n++ {
		if n == scanLimit {
			return nil, fmt.Errorf("more than %d messages in %s", scanLimit, subjects.StreamPipeline)
		}
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subjects.PipeAll))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, err
		}
		if k := msgIDKey(m.Header.Get(jetstream.MsgIDHeader)); k != "" {
			out[k] = max(out[k], m.Sequence)
		}
		seq = m.Sequence + 1
	}
	return out, nil
}

// deleteLeftover deletes message seq of stream, trying deleteAttempts times
// with a short backoff (once if the bus refuses it); a later sweep tries
// again.
func (r *Runner) deleteLeftover(ctx context.Context, stream jetstream.Stream, name string, seq uint64) error {
	var err error
	for attempt := 1; attempt <= deleteAttempts; attempt++ {
		if err = r.deleteMsg(ctx, stream, name, seq); err == nil || errors.Is(err, jetstream.ErrMsgNotFound) {
			return err
		}
		if r.Metrics != nil {
			r.Metrics.deleteFailures.WithLabelValues(r.Name, name).Inc()
		}
		r.Log.Warn("deleting a message left in a work queue", "stream", name, "seq", seq, "attempt", attempt, "err", err)
		if attempt == deleteAttempts || errors.Is(err, ErrDeleteRefused) {
			// A refusal is not retried at once: the rights change only
			// with new credentials.
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
		}
	}
	return err
}

// deleteMsg deletes one message with a short deadline. A refusal for want
// of the right gets no reply, only an asynchronous error on the
// connection: a request that timed out while the connection's last error
// names the delete is reported as ErrDeleteRefused.
func (r *Runner) deleteMsg(ctx context.Context, stream jetstream.Stream, name string, seq uint64) error {
	ctx, cancel := context.WithTimeout(ctx, deleteTimeout)
	defer cancel()
	err := stream.DeleteMsg(ctx, seq)
	if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) {
		return err
	}
	if last := r.JS.Conn().LastError(); errors.Is(last, nats.ErrPermissionViolation) &&
		strings.Contains(last.Error(), "MSG.DELETE."+name) {
		return fmt.Errorf("%w: message %d of %s: %v", ErrDeleteRefused, seq, name, last)
	}
	return fmt.Errorf("deleting message %d of %s: %w", seq, name, err)
}

// leftBehind lists the messages of in's stream matching its filter that
// its consumer passed over (see sweep), oldest first, at most sweepBatch.
func (r *Runner) leftBehind(ctx context.Context, in subjects.Input) ([]uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := r.JS.Consumer(ctx, in.Stream, in.Consumer)
	if err != nil {
		return nil, err
	}
	info := c.CachedInfo()
	upTo := info.AckFloor.Stream
	if info.NumAckPending == 0 {
		upTo = info.Delivered.Stream
	}
	if upTo == 0 {
		return nil, nil
	}
	stream, err := r.JS.Stream(ctx, in.Stream)
	if err != nil {
		return nil, err
	}
	var out []uint64
	for seq := max(stream.CachedInfo().State.FirstSeq, 1); len(out) < sweepBatch && seq <= upTo; {
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(in.Filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, err
		}
		if m.Sequence > upTo {
			break
		}
		out = append(out, m.Sequence)
		seq = m.Sequence + 1
	}
	return out, nil
}
