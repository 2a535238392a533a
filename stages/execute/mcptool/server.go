package mcptool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/backoff"
)

// conn is one live connection to a server.
type conn struct {
	session *mcp.ClientSession
	// done is closed when the server is gone (process exited, connection
	// lost); why says how, and is set before done closes.
	done chan struct{}
	why  error
	// stop ends the connection on purpose and releases what it holds.
	stop func()
}

// dialFunc starts or reaches a server and completes the MCP handshake.
type dialFunc func(ctx context.Context) (*conn, error)

// Backoff bounds the delay before a crashed server is started again: Min
// after the first failure, doubling with each consecutive one, up to Max.
type Backoff struct {
	Min, Max time.Duration
}

func (b Backoff) delay(failures int) time.Duration {
	return backoff.Exponential(failures, b.Min, b.Max)
}

// server supervises one server definition: it starts the server on first
// use, keeps it running between calls, starts it again after a crash with
// exponential backoff, and lets at most cap(sem) calls reach it at once.
type server struct {
	name         string
	dial         dialFunc
	sem          chan struct{}
	backoff      Backoff
	startTimeout time.Duration
	log          *slog.Logger

	mu       sync.Mutex
	cur      *conn
	starting chan struct{} // closed when the start in flight has ended
	failures int           // consecutive, since the last successful call
	retryAt  time.Time
	lastErr  error
	timer    *time.Timer
	closed   bool
	starts   int // successful starts, for tests and logs
}

func newServer(name string, dial dialFunc, concurrency int, b Backoff, startTimeout time.Duration, log *slog.Logger) *server {
	return &server{name: name, dial: dial, sem: make(chan struct{}, concurrency), backoff: b,
		startTimeout: startTimeout, log: log}
}

// call runs tool on the server with args.
func (s *server) call(ctx context.Context, tool string, args json.RawMessage) (*mcp.CallToolResult, error) {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-s.sem }()
	c, err := s.get(ctx)
	if err != nil {
		return nil, err
	}
	params := &mcp.CallToolParams{Name: tool, Arguments: args}
	done := track(ctx, params)
	res, err := c.session.CallTool(ctx, params)
	cpErr := done()
	if err != nil {
		return nil, s.callErr(ctx, c, tool, err)
	}
	if cpErr != nil {
		return nil, cpErr
	}
	s.mu.Lock()
	s.failures = 0 // a server that answers is healthy again
	s.mu.Unlock()
	return res, nil
}

// get returns the live connection, waiting for a start in flight or
// starting the server itself; while a crashed server waits out its backoff
// it returns E3120 at once, so callers are not held.
func (s *server) get(ctx context.Context) (*conn, error) {
	for {
		s.mu.Lock()
		if c := s.cur; c != nil {
			select {
			case <-c.done: // gone, and watch has not noticed yet
				s.cur = nil
				s.failed(c.why)
			default:
			}
		}
		switch {
		case s.closed:
			s.mu.Unlock()
			return nil, s.downErr("toolgate is shutting it down", 0)
		case s.cur != nil:
			c := s.cur
			s.mu.Unlock()
			return c, nil
		case s.starting == nil:
			if wait := time.Until(s.retryAt); wait > 0 {
				err := s.downErr(fmt.Sprintf("it failed (%v)", s.lastErr), wait)
				s.mu.Unlock()
				return nil, err
			}
			s.beginStart()
		}
		ch := s.starting
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// beginStart starts the server in the background; s.mu is held. The start
// does not belong to any one call, so a caller giving up does not waste it.
func (s *server) beginStart() {
	ch := make(chan struct{})
	s.starting = ch
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.startTimeout)
		c, err := s.dial(ctx)
		cancel()
		s.mu.Lock()
		defer s.mu.Unlock()
		s.starting = nil
		defer close(ch)
		switch {
		case err != nil:
			s.failed(err)
		case s.closed:
			go c.stop()
		default:
			s.cur = c
			s.starts++
			s.log.Info("mcp server started", "server", s.name, "starts", s.starts)
			go s.watch(c)
		}
	}()
}

// watch notices a server going away and schedules its restart.
func (s *server) watch(c *conn) {
	<-c.done
	s.mu.Lock()
	if s.cur == c { // else get saw it first
		s.cur = nil
		if !s.closed {
			s.failed(c.why)
		}
	}
	s.mu.Unlock()
	c.stop()
}

// failed records a failure and schedules the next start; s.mu is held.
func (s *server) failed(err error) {
	s.failures++
	s.lastErr = err
	d := s.backoff.delay(s.failures)
	s.retryAt = time.Now().Add(d)
	s.log.Warn("mcp server down", "server", s.name, "err", err, "failures", s.failures, "restart_in", d)
	if s.timer != nil {
		s.timer.Stop()
	}
	// Restarting ahead of the next call keeps the server warm.
	s.timer = time.AfterFunc(d, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.closed && s.cur == nil && s.starting == nil {
			s.beginStart()
		}
	})
}

// close stops the server and any restart, waiting for a start in flight.
func (s *server) close() {
	s.mu.Lock()
	s.closed = true
	if s.timer != nil {
		s.timer.Stop()
	}
	c, ch := s.cur, s.starting
	s.cur = nil
	s.mu.Unlock()
	if c != nil {
		c.stop()
	}
	if ch != nil {
		<-ch
	}
}

func (s *server) downErr(why string, wait time.Duration) error {
	msg := fmt.Sprintf("MCP server %s is not running: %s", s.name, why)
	e := api.NewError(api.ExternalAPIError, api.EMCPServerDown, "%s", msg).AsRetryable().
		WithDetail("not_started", true).WithDetail("server", s.name)
	if wait > 0 {
		e = api.NewError(api.ExternalAPIError, api.EMCPServerDown, "%s; next start in %v", msg, wait.Round(time.Millisecond)).
			AsRetryable().WithDetail("not_started", true).WithDetail("server", s.name).
			WithDetail("retry_after_ms", wait.Milliseconds())
	}
	return e
}

// exitGrace is how long a failed call waits to learn whether the server
// died: its stdout closes a moment before its exit status is known.
const exitGrace = 2 * time.Second

// callErr says why a call failed: its context ended (the executor reports
// the timeout or cancel), the server died under it (E3121), or the server
// refused it (E3122).
func (s *server) callErr(ctx context.Context, c *conn, tool string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var rpc *jsonrpc.Error
	if errors.As(err, &rpc) {
		return api.WrapError(err, api.ToolExecutionError, api.EMCPProtocol,
			"MCP server %s refused the call of %s: %s", s.name, tool, rpc.Message).
			WithDetail("rpc_code", rpc.Code).WithDetail("server", s.name)
	}
	select {
	case <-c.done:
		return api.WrapError(err, api.ToolExecutionError, api.EMCPServerExited,
			"MCP server %s exited during the call of %s: %v", s.name, tool, c.why).WithDetail("server", s.name)
	case <-time.After(exitGrace):
	case <-ctx.Done():
		return ctx.Err()
	}
	if errors.Is(err, mcp.ErrConnectionClosed) {
		return api.WrapError(err, api.ToolExecutionError, api.EMCPServerExited,
			"the connection to MCP server %s closed during the call of %s", s.name, tool).WithDetail("server", s.name)
	}
	return api.WrapError(err, api.ToolExecutionError, api.EMCPProtocol,
		"MCP server %s: calling %s: %v", s.name, tool, err).WithDetail("server", s.name)
}
