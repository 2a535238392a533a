package runner

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/subjects"
)

// DefaultSweepEvery is how often a Runner looks for messages its consumers
// passed over without settling them (Runner.SweepEvery).
const DefaultSweepEvery = time.Minute

// sweepBatch bounds the messages one sweep of one consumer looks at.
const sweepBatch = 1000

// sweep ends, every SweepEvery, the messages the stage's consumers passed
// over without a settlement. JetStream leaves a message that reached the
// delivery limit in its work-queue stream, drops it from the consumer's
// pending set and announces it once, with an advisory nobody hears again:
// if the process that took the advisory died before ending the invocation,
// or no process of the stage was listening, only this sweep ends it.
//
// A consumer's snapshot (one info call) tells such messages apart: every
// message still in the stream at or below the last sequence the consumer
// delivered is either pending (counted in NumAckPending, including those
// waiting for redelivery) or passed over. So when nothing is pending, every
// such message is passed over; and any at or below the ack floor is,
// whatever is pending. A busy consumer is swept when it next has nothing
// pending. A message is ended only once two sweeps in a row found it, so an
// acknowledged message whose removal is still on its way through a
// cluster is not taken for a forgotten one.
//
// Every process of a stage sweeps; two that end the same message publish
// the same hand-off to audit under the same message id, which the stream
// keeps once, and past its duplicate window audit's first-ending-wins rule
// drops the second.
func (r *Runner) sweep(ctx context.Context) {
	every := r.SweepEvery
	if every < 0 {
		return
	}
	if every == 0 {
		every = DefaultSweepEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	seen := map[string]map[uint64]bool{} // consumer → sequences below its floor last time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, in := range subjects.Inputs(r.Name) {
			below, err := r.leftBehind(ctx, in)
			if err != nil {
				if ctx.Err() == nil {
					r.Log.Warn("sweeping for unsettled messages", "consumer", in.Consumer, "err", err)
				}
				continue // keep what the last sweep saw
			}
			now := make(map[uint64]bool, len(below))
			for _, seq := range below {
				if !seen[in.Consumer][seq] {
					now[seq] = true // first sighting: confirm next time
					continue
				}
				r.Log.Warn("ending a message its consumer passed over without a settlement", "consumer", in.Consumer, "seq", seq)
				err := r.endExhausted(ctx, maxDeliveriesAdvisory{Stream: in.Stream, Consumer: in.Consumer,
					StreamSeq: seq, Deliveries: uint64(max(r.MaxDeliver, 0))})
				if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
					r.Log.Error("ending a passed-over message", "consumer", in.Consumer, "seq", seq, "err", err)
					now[seq] = true // try again next sweep
				}
			}
			seen[in.Consumer] = now
		}
	}
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
