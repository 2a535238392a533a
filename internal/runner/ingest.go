package runner

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// ingestBacklog bounds the deletes waiting to be sent; past it one is
// skipped, and the invoke sweep deletes the message once it finds the call
// ended.
const ingestBacklog = 1 << 14

// ingestOf is the invoke stream's sequence of the call msg settles for good
// when it settles as the call's ending (audit's input from the pipeline) or
// as validate's last word on it; 0 otherwise. Read before the message is
// settled: once handed on, inv is not this Runner's.
func (r *Runner) ingestOf(md *jetstream.MsgMetadata, inv *envelope.Invocation) uint64 {
	switch {
	case !r.KeptIngest:
		return 0
	case r.finalises() && md.Stream == subjects.StreamPipeline:
		if stages.Swept(inv.Error) {
			// Audit refuses a sweep's ending of a call a live worker
			// holds, which goes on: the invoke sweep deletes the ingest
			// once the call ends.
			return 0
		}
		return inv.Event.Seq
	case md.Stream == subjects.StreamInvoke:
		return md.Sequence.Stream
	}
	return 0
}

// dropIngest queues the delete of the invoke stream's message seq when
// outcome settles its call for good: audit finished it, or validate
// stopped its redelivery. Everything else (handed on, retried, parked)
// still needs it for a re-drive.
func (r *Runner) dropIngest(seq uint64, outcome string) {
	if seq == 0 || r.ingest == nil {
		return
	}
	switch {
	case r.finalises() && outcome == outcomeFinished:
	case r.Name == subjects.Validate && outcome == outcomeTerminated:
	default:
		return
	}
	select {
	case r.ingest <- seq:
	default:
	}
}

// ingestLinger is how long the first of a batch of deletes waits for
// others. The file store removes a block the moment its last message goes
// and makes a new one for the next write, a file unlinked and another
// created: deleted one by one as calls end, the ingests of calls that
// arrive apart empty the stream each time. Sent together, the batch
// empties it once.
const ingestLinger = 200 * time.Millisecond

// deleteIngests sends the queued deletes, one batch at a time, off the
// path of the calls: a delete that fails leaves the message to the invoke
// sweep, which deletes what belongs to an ended call. Once ctx is done it
// sends what is queued for a moment more; what is left then is re-driven
// at the next start and found ended.
func (r *Runner) deleteIngests(ctx context.Context) {
	nc := r.JS.Conn()
	subject := subjects.MsgDelete(subjects.StreamInvoke)
	send := func(ctx context.Context, seq uint64) {
		rctx, cancel := context.WithTimeout(ctx, deleteTimeout)
		defer cancel()
		if _, err := nc.RequestWithContext(rctx, subject, fmt.Appendf(nil, `{"seq":%d,"no_erase":true}`, seq)); err != nil && ctx.Err() == nil {
			r.Log.Debug("deleting an ended call's invocation", "seq", seq, "err", err)
		}
	}
	linger := time.NewTimer(ingestLinger)
	linger.Stop()
	var batch []uint64
	for ctx.Err() == nil {
		select {
		case seq := <-r.ingest:
			linger.Reset(ingestLinger)
			select {
			case <-linger.C:
			case <-ctx.Done():
				linger.Stop()
			}
			batch = sendBatch(ctx, drainIngests(r.ingest, append(batch, seq)), send)
		case <-ctx.Done():
		}
	}
	// What is left of the batch and what is queued, for a moment more.
	last, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	for batch = drainIngests(r.ingest, batch); len(batch) > 0 && last.Err() == nil; batch = drainIngests(r.ingest, batch) {
		batch = sendBatch(last, batch, send)
	}
}

// sendBatch sends the deletes of batch oldest first, so that the stream's
// first message moves up rather than leaving holes behind it, until ctx
// is done; it returns those not sent, in batch's array.
func sendBatch(ctx context.Context, batch []uint64, send func(context.Context, uint64)) []uint64 {
	slices.Sort(batch)
	n := 0
	for ; n < len(batch) && ctx.Err() == nil; n++ {
		send(ctx, batch[n])
	}
	return append(batch[:0], batch[n:]...)
}

// drainIngests appends to batch what ingest holds now.
func drainIngests(ingest <-chan uint64, batch []uint64) []uint64 {
	for {
		select {
		case seq := <-ingest:
			batch = append(batch, seq)
		default:
			return batch
		}
	}
}
