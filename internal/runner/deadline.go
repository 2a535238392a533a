package runner

import (
	"context"
	"sync/atomic"
	"time"
)

// sharedDeadline is a context ending at a deadline that the messages
// started within the same slice of time share.
type sharedDeadline struct {
	at     time.Time
	ctx    context.Context
	cancel context.CancelFunc // never called: in-flight stages hold ctx until it ends by itself
}

// deadline is the context a message's stage runs under, ending Timeout
// from now at the latest and no more than a 32nd of Timeout (at most
// 100ms) sooner. A context with a timer of its own for every message cost
// four allocations, a timer started and stopped and a cancellation; one
// per slice of time costs none of that per message. A stage's context is
// thus not cancelled when Process returns: what a stage starts with it
// must end by itself, as its own cancellation or the deadline, at the
// latest.
func (r *Runner) deadline() context.Context { return sharedContext(&r.deadlines, r.Timeout) }

// sharedContext is a context ending timeout from now at the latest, and
// no more than a 32nd of it (at most 100ms) sooner, shared through last
// with the callers of the same slice of time.
func sharedContext(last *atomic.Pointer[sharedDeadline], timeout time.Duration) context.Context {
	now := time.Now() // the context's clock, not r.now
	slice := min(timeout/32, 100*time.Millisecond)
	if slice <= 0 {
		slice = 1
	}
	at := now.Add(timeout).Truncate(slice)
	if d := last.Load(); d != nil && d.at.Equal(at) {
		return d.ctx
	}
	d := &sharedDeadline{at: at}
	d.ctx, d.cancel = context.WithDeadline(context.Background(), at)
	last.Store(d)
	return d.ctx
}
