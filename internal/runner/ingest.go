package runner

import (
	"context"
	"encoding/json"
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

// deleteIngests sends the queued deletes, one at a time, off the path of
// the calls: a delete that fails leaves the message to the invoke sweep,
// which deletes what belongs to an ended call.
func (r *Runner) deleteIngests(ctx context.Context) {
	nc := r.JS.Conn()
	subject := subjects.MsgDelete(subjects.StreamInvoke)
	for {
		select {
		case <-ctx.Done():
			return
		case seq := <-r.ingest:
			req, _ := json.Marshal(struct {
				Seq     uint64 `json:"seq"`
				NoErase bool   `json:"no_erase"`
			}{seq, true})
			rctx, cancel := context.WithTimeout(ctx, deleteTimeout)
			_, err := nc.RequestWithContext(rctx, subject, req)
			cancel()
			if err != nil && ctx.Err() == nil {
				r.Log.Debug("deleting an ended call's invocation", "seq", seq, "err", err)
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
}
