package execute

import (
	"context"
	"errors"
	"sync"
)

// ErrCancelRequested is the cause of a tool context cancelled on request.
var ErrCancelRequested = errors.New("cancelled on request")

// Running tracks the invocations this process is running, so that a cancel
// announcement reaching the process stops the one it names.
type Running struct {
	mu sync.Mutex
	m  map[string]context.CancelCauseFunc
}

// NewRunning returns an empty registry.
func NewRunning() *Running { return &Running{m: map[string]context.CancelCauseFunc{}} }

func runningKey(tenant, id string) string { return tenant + "\x00" + id }

// Cancel stops the named invocation if it runs here.
func (r *Running) Cancel(tenant, id string) bool {
	r.mu.Lock()
	cancel, ok := r.m[runningKey(tenant, id)]
	r.mu.Unlock()
	if ok {
		cancel(ErrCancelRequested)
	}
	return ok
}

// add registers a running invocation; the returned func removes it.
func (r *Running) add(tenant, id string, cancel context.CancelCauseFunc) func() {
	k := runningKey(tenant, id)
	r.mu.Lock()
	r.m[k] = cancel
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.m, k)
		r.mu.Unlock()
	}
}
