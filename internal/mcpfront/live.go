package mcpfront

import (
	"context"
	"errors"
	"sync"
	"time"
)

// errConnectionClosed is the cause a call's context ends with when the HTTP
// connection of the POST that carries it closes before its response went
// out.
var errConnectionClosed = errors.New("the MCP client's connection closed before the call ended")

// liveCalls are the tools/calls of HTTP POSTs, by "<session id> <request
// id>". The SDK (stateful streamable HTTP, no event store) neither cancels a
// call whose POST's connection dropped nor can deliver its response later:
// the front end ends such a call itself, as if the client had cancelled it.
// The POST's handler may return before the SDK has started the call, so a
// dropped call not yet started is remembered and ended when it starts.
type liveCalls struct {
	mu sync.Mutex
	m  map[string]*liveCall
}

type liveCall struct {
	cancel context.CancelCauseFunc // set once the call has started
	gone   time.Time               // when its connection closed, before it started
}

// goneFor bounds how long a dropped call that never started is remembered.
const goneFor = time.Minute

// expect notes that a POST carries call key, before the SDK sees it.
func (l *liveCalls) expect(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]*liveCall{}
	}
	if _, ok := l.m[key]; !ok {
		l.m[key] = &liveCall{}
	}
}

// start registers a running call; it returns the function to call when it
// ends. A call whose connection already closed is cancelled at once.
func (l *liveCalls) start(key string, cancel context.CancelCauseFunc) func() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]*liveCall{}
	}
	c := l.m[key]
	if c == nil || c.cancel != nil {
		c = &liveCall{}
		l.m[key] = c
	}
	c.cancel = cancel
	if !c.gone.IsZero() {
		cancel(errConnectionClosed)
	}
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.m[key] == c {
			delete(l.m, key)
		}
	}
}

// closed is told that the POST carrying key ended. With its connection
// gone (dropped), a running call is cancelled and one not yet started is
// marked; otherwise a call that never started is forgotten.
func (l *liveCalls) closed(key string, dropped bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.m[key]
	if c == nil {
		return
	}
	switch {
	case c.cancel != nil && dropped:
		c.cancel(errConnectionClosed)
	case c.cancel != nil:
	case dropped:
		c.gone = time.Now()
	default:
		delete(l.m, key)
	}
	// Calls marked that never started (the SDK refused them) are let go.
	for k, o := range l.m {
		if o.cancel == nil && !o.gone.IsZero() && time.Since(o.gone) > goneFor {
			delete(l.m, k)
		}
	}
}
