// Package mcpfront makes toolgate a Model Context Protocol server: an agent's
// MCP client lists the tools its capability token may call and calls them,
// and every tools/call is a tool.invoke through the six stages (validate,
// authorize, route, execute, verify, audit), so policy, approvals, budgets,
// sandboxing, output checks and the audit trail apply as to any other caller.
//
// It serves one agent over stdio (ServeStdio, token given at start) or many
// over streamable HTTP (Handler, a capability token on every request as
// `Authorization: Bearer`). Each MCP session gets its own server holding
// exactly the tools its token grants, kept current from the registry, so
// tools/list, pagination and notifications/tools/list_changed are the SDK's.
//
// Lifecycle of a call: the invocation id is derived from the session id and
// the JSON-RPC request id (a retried request is the same invocation, which
// toolgate deduplicates); the handler waits for the tool.result, relaying
// progress and the approval wait as MCP progress notifications; when the
// client cancels the request, or its session ends (stdio closed, HTTP
// session deleted or timed out), the invocation is cancelled through the
// control service.
package mcpfront

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/control"
	"github.com/toolgate/toolgate/internal/signedstate"
	"github.com/toolgate/toolgate/internal/token"
)

// ServerName is the name toolgate gives in the initialize handshake.
const ServerName = "toolgate"

// Defaults of Config.
const (
	DefaultMaxArgumentBytes = 512 << 10
	DefaultPageSize         = 100
	DefaultStatusInterval   = 500 * time.Millisecond
	DefaultProgressInterval = 10 * time.Second
	DefaultMaxWait          = 30 * time.Minute
	DefaultSessionTimeout   = 30 * time.Minute
)

// ErrConfig wraps every configuration error of Run.
var ErrConfig = errors.New("mcp: invalid configuration")

// Config configures the MCP front end.
type Config struct {
	// Stdio serves one session on standard input and output with Token;
	// otherwise Listen serves streamable HTTP at /mcp (and /).
	Stdio  bool
	Listen string
	// Token is the capability token of the stdio session. Without
	// NATSOptions it is also who the front end connects as, over stdio and
	// HTTP alike (see ConnectOptions): the connection then holds exactly
	// that agent's rights, the registry is read through its tenant's
	// endpoints (NewAgentBus), and over HTTP only tokens of its tenant are
	// served.
	Token string
	// NATSURL is the toolgate to talk to, when Bus is nil.
	NATSURL string
	// NATSOptions authenticate the front door itself (a worker's or an
	// operator's credentials, given explicitly): it reads the tools bucket
	// and serves agents of every tenant over HTTP. Each call still carries
	// the caller's capability token, which the pipeline verifies.
	NATSOptions []nats.Option
	// RegistryInterval is how often a front end connected as an agent
	// reads the tool listing again; default DefaultRegistryInterval.
	RegistryInterval time.Duration
	// Bus replaces the NATS connection (tests, other transports).
	Bus Bus
	// Verifier checks capability tokens: required for HTTP, and for stdio
	// it turns a bad token into an error at start rather than on each call.
	Verifier *token.Verifier
	// BusVerifier, over HTTP without a Verifier, is the verifier (issuer,
	// audience, leeway; Run sets its Keys) of the key set the control
	// service publishes (tool.svc.tokens.keys): fetched at start, again
	// every KeysInterval and on a token of a kid it lacks. A front end
	// connected as an agent that cannot fetch it serves only its own token.
	BusVerifier *token.Verifier
	// KeysInterval is how often the key set of BusVerifier is fetched
	// again; default DefaultKeysInterval.
	KeysInterval time.Duration
	// Tenant, when set, refuses tokens of any other tenant.
	Tenant string
	// agent, when set, refuses tokens of any other agent: a front end
	// connected as an agent reads only that agent's results and status.
	agent string
	// PageSize is the number of tools per tools/list page; default 100.
	PageSize int
	// MaxArgumentBytes bounds a call's arguments; default 512 KiB.
	MaxArgumentBytes int
	// StatusInterval is how often a waiting call reads its invocation's
	// record for progress and the approval wait; default 500 ms.
	StatusInterval time.Duration
	// ProgressInterval is the longest a waiting call with a progress token
	// goes without a progress notification; default 10 s (MCP clients time
	// requests out after 60 s by default).
	ProgressInterval time.Duration
	// MaxWait bounds how long one tools/call waits for its result,
	// approval included; default 30 min (past toolgate's approval timeout).
	MaxWait time.Duration
	// WaitApproval keeps a tools/call that waits for a person's approval
	// open until it ends (relaying the wait as progress), as before
	// toolgate_status: a client that times requests out cancels the call.
	// By default such a call is answered at once with its invocation id,
	// and the session serves StatusTool to learn its outcome.
	WaitApproval bool
	// StatusWait is how long a toolgate_status call waits for the call to
	// end by default; default DefaultStatusWait.
	StatusWait time.Duration
	// SessionTimeout closes HTTP sessions idle this long; default 30 min.
	SessionTimeout time.Duration
	Log            *slog.Logger
	// StateProof, with service credentials on an authenticated bus, makes
	// the registry read from the tools bucket honour only manifests an
	// operator signed (internal/signedstate).
	StateProof signedstate.Verify

	// admitted, set by Run for HTTP without a Verifier, is the one token
	// served: the one the bus admitted the front end's connection with.
	admitted       string
	admittedClaims *token.Claims
}

func (c *Config) valid() error {
	switch {
	case c.Stdio && c.Listen != "":
		return fmt.Errorf("%w: --stdio and --listen exclude each other", ErrConfig)
	case !c.Stdio && c.Listen == "":
		return fmt.Errorf("%w: give --stdio or --listen HOST:PORT", ErrConfig)
	case c.Stdio && c.Token == "":
		return fmt.Errorf("%w: no capability token (TOOLGATE_TOKEN or --token-file)", ErrConfig)
	case !c.Stdio && c.Verifier == nil && c.BusVerifier == nil && (c.Token == "" || len(c.NATSOptions) > 0 || c.Bus != nil):
		// Connected as the agent of Token, HTTP serves that one token
		// without a key set (see Front.verifyToken); any other front end
		// verifies what each request brings.
		return fmt.Errorf("%w: HTTP needs a key set to verify tokens (--jwks, or --data with a development key), or the agent's token to serve (TOOLGATE_TOKEN, --token-file)", ErrConfig)
	}
	return nil
}

func (c *Config) defaults() {
	c.PageSize = cmp.Or(c.PageSize, DefaultPageSize)
	c.MaxArgumentBytes = cmp.Or(c.MaxArgumentBytes, DefaultMaxArgumentBytes)
	c.StatusInterval = cmp.Or(c.StatusInterval, DefaultStatusInterval)
	c.ProgressInterval = cmp.Or(c.ProgressInterval, DefaultProgressInterval)
	c.MaxWait = cmp.Or(c.MaxWait, DefaultMaxWait)
	c.SessionTimeout = cmp.Or(c.SessionTimeout, DefaultSessionTimeout)
	c.StatusWait = cmp.Or(c.StatusWait, DefaultStatusWait)
	c.KeysInterval = cmp.Or(c.KeysInterval, DefaultKeysInterval)
	if c.Log == nil {
		c.Log = slog.Default()
	}
}

// Run serves MCP as configured until ctx ends (or, with Stdio, until the
// client closes standard input).
func Run(ctx context.Context, c Config) error {
	if err := c.valid(); err != nil {
		return err
	}
	c.defaults()
	var claims *token.Claims
	if c.Token != "" {
		var err error
		if claims, err = stdioClaims(c.Verifier, c.Token); err != nil {
			return fmt.Errorf("capability token: %w", err)
		}
	}
	lost := make(chan error, 1) // the bus closed the connection for good
	if c.Bus == nil {
		// With a token and no service credentials, the front end is that
		// agent on the bus; with neither (HTTP on a bus without
		// authentication) it connects anonymously.
		asAgent := len(c.NATSOptions) == 0 && claims != nil
		opts := c.NATSOptions
		if asAgent {
			// Connected as the agent, the front end can reach its own
			// tenant only: say so at start rather than on every call.
			if c.Tenant != "" && c.Tenant != claims.TenantID {
				return fmt.Errorf("%w: --tenant %s, but the token is for tenant %s", ErrConfig, c.Tenant, claims.TenantID)
			}
			c.Tenant = claims.TenantID
			if !claims.TenantReader {
				c.agent = claims.AgentDID
			}
			opts = ConnectOptions(claims, c.Token)
			if !c.Stdio && c.Verifier == nil {
				c.admitted, c.admittedClaims = c.Token, claims
			}
		}
		// A revoked token's connection is closed by the bus, and its
		// reconnects refused: the front end then ends its sessions
		// (busRefused). Quick retries bound how long that takes.
		opts = append(slices.Clone(opts), nats.ReconnectWait(250*time.Millisecond),
			nats.ClosedHandler(func(nc *nats.Conn) {
				if err := nc.LastError(); err != nil {
					select {
					case lost <- err:
					default:
					}
				}
			}))
		nc, err := nats.Connect(c.NATSURL, opts...)
		if errors.Is(err, nats.ErrAuthorization) && len(c.NATSOptions) == 0 {
			if asAgent {
				return fmt.Errorf("connecting to %s: the bus refused the capability token (expired, revoked, or not signed by a key it trusts): %w", c.NATSURL, err)
			}
			return fmt.Errorf("connecting to %s: the bus admits no anonymous connections: give the agent's token (TOOLGATE_TOKEN, --token-file) or service credentials (--creds): %w", c.NATSURL, err)
		}
		if err != nil {
			return fmt.Errorf("connecting to %s: %w", c.NATSURL, err)
		}
		defer nc.Close()
		if asAgent {
			c.Bus, err = NewAgentBus(nc, claims.TenantID, c.RegistryInterval, c.Log)
		} else {
			c.Bus, err = newNATSBus(ctx, nc, c.Log, c.StateProof)
		}
		if err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := c.keysFromBus(ctx); err != nil {
		return err
	}
	f, err := Start(ctx, c)
	if err != nil {
		return err
	}
	if b, ok := c.Bus.(*NATSBus); ok && !c.Stdio && b.readsBuckets() {
		// Sessions of a token revoked while they last end at once.
		if err := b.WatchRevocations(ctx, f.Revoked); err != nil {
			c.Log.Warn("not watching revocations: a revoked token's session ends at its next call", "err", err)
		}
	}
	var refused atomic.Pointer[api.Error]
	go func() {
		select {
		case err := <-lost:
			if e := f.busRefused(err, claims); e != nil {
				refused.Store(e)
				if c.Stdio {
					cancel()
				}
			}
		case <-ctx.Done():
		}
	}()
	if c.Stdio {
		err := f.ServeStdio(ctx, &mcp.StdioTransport{}, claims, c.Token)
		if e := refused.Load(); e != nil {
			return e
		}
		return err
	}
	srv := &http.Server{Addr: c.Listen, Handler: f.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	c.Log.Info("serving MCP over streamable HTTP", "addr", c.Listen, "path", "/mcp")
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = srv.Shutdown(sctx)
	f.closeAll()
	return nil
}

// Front is the MCP front end: the sessions it serves and their tool lists.
type Front struct {
	cfg Config

	mu       sync.Mutex
	sessions map[string]*session // by session id
	changed  chan struct{}
	// withdrawn are the HTTP calls ("<session id> <request id>") the client
	// cancelled, whose response is kept back (see callReply).
	withdrawn withdrawn
	// live are the HTTP calls in flight, ended when their connection
	// closes.
	live liveCalls

	// parked are the calls answered while they wait for approval.
	parked parkedCalls

	// revoked are the token ids this front end knows are revoked;
	// refused, once set, is why the bus no longer serves it at all.
	revoked token.Revocations
	refused atomic.Pointer[api.Error]

	// unknownSession is the server given for requests naming a session
	// that does not exist (see serverFor): no tools, never connected.
	unknownSession func() *mcp.Server
}

// Start loads the registry through c.Bus and keeps every session's tool
// list current until ctx ends.
func Start(ctx context.Context, c Config) (*Front, error) {
	c.defaults()
	if c.Bus == nil {
		return nil, fmt.Errorf("%w: no bus", ErrConfig)
	}
	f := &Front{cfg: c, sessions: map[string]*session{}, changed: make(chan struct{}, 1)}
	f.unknownSession = sync.OnceValue(func() *mcp.Server {
		return mcp.NewServer(&mcp.Implementation{Name: ServerName, Version: control.Version}, nil)
	})
	if err := c.Bus.WatchTools(ctx, f.registryChanged); err != nil {
		return nil, fmt.Errorf("watching the registry: %w", err)
	}
	go f.refreshLoop(ctx)
	return f, nil
}

func (f *Front) registryChanged() {
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// refreshLoop brings every session's tool list up to date after registry
// changes; a burst of changes is one refresh.
func (f *Front) refreshLoop(ctx context.Context) {
	sweep := time.NewTicker(time.Minute)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sweep.C:
			f.sweep(time.Minute)
			f.parked.forget(2 * f.cfg.MaxWait)
			continue
		case <-f.changed:
		}
		f.mu.Lock()
		ss := make([]*session, 0, len(f.sessions))
		for _, s := range f.sessions {
			ss = append(ss, s)
		}
		f.mu.Unlock()
		for _, s := range ss {
			s.refresh()
		}
	}
}

// sweep drops sessions older than grace whose server has no live
// connection: an HTTP session that was opened but never initialized, or
// closed by the SDK (idle timeout) before it was.
func (f *Front) sweep(grace time.Duration) {
	f.mu.Lock()
	var dead []*session
	for _, s := range f.sessions {
		if time.Since(s.created) < grace {
			continue
		}
		live := false
		for range s.server.Sessions() {
			live = true
			break
		}
		if !live {
			dead = append(dead, s)
		}
	}
	f.mu.Unlock()
	for _, s := range dead {
		f.drop(s)
	}
}

func (f *Front) closeAll() {
	f.mu.Lock()
	ss := f.sessions
	f.sessions = map[string]*session{}
	f.mu.Unlock()
	for _, s := range ss {
		s.end()
	}
}

// busRefused takes the bus closing the front end's connection for good
// with err. When the bus refused the credentials (the token the front end
// connects as, claims, was revoked or expired), every session ends and
// every later HTTP request is answered 401; the error returned says why
// (ETokenRevoked or ETokenExpired). Other closes return nil.
func (f *Front) busRefused(err error, claims *token.Claims) *api.Error {
	if !errors.Is(err, nats.ErrAuthorization) && !errors.Is(err, nats.ErrAuthRevoked) && !errors.Is(err, nats.ErrAuthExpired) {
		f.cfg.Log.Error("the bus connection closed", "err", err)
		return nil
	}
	e := api.NewError(api.PermissionDenied, api.ETokenRevoked,
		"the bus closed the session: it no longer accepts the capability token (revoked)")
	if claims != nil && claims.ExpiresAt != nil && !time.Now().Before(claims.ExpiresAt.Time) || errors.Is(err, nats.ErrAuthExpired) {
		e = api.NewError(api.PermissionDenied, api.ETokenExpired, "the bus closed the session: the capability token expired")
	}
	if claims != nil {
		f.revoked.Set(claims.ID, true)
	}
	f.refused.Store(e)
	f.cfg.Log.Error("ending every session", "err", e)
	f.closeAll()
	return e
}

// Revoked marks a token id revoked for this front end: the sessions of it
// (or of a token derived from it) end and their next HTTP request is
// answered 401. A tools/call the pipeline refuses as revoked marks it too.
func (f *Front) Revoked(jti string) {
	f.revoked.Set(jti, true)
	f.mu.Lock()
	var ended []*session
	for id, s := range f.sessions {
		if _, gone := f.revoked.Revoked(s.claims); gone {
			delete(f.sessions, id)
			ended = append(ended, s)
		}
	}
	f.mu.Unlock()
	for _, s := range ended {
		s.end()
	}
}

// keysFromBus sets Verifier to BusVerifier over the key set the bus
// publishes, when HTTP has no other.
func (c *Config) keysFromBus(ctx context.Context) error {
	if c.Stdio || c.Verifier != nil || c.BusVerifier == nil {
		return nil
	}
	kf, ok := c.Bus.(keyFetcher)
	if !ok {
		return fmt.Errorf("%w: HTTP needs a key set to verify tokens (--jwks)", ErrConfig)
	}
	keys := &busKeys{fetch: kf.TokenKeys, log: c.Log}
	if err := keys.load(ctx); err != nil {
		if c.admitted == "" {
			return fmt.Errorf("%w: HTTP needs a key set to verify tokens (--jwks): %v", ErrConfig, err)
		}
		c.Log.Warn("serving only the token this front end connected with: the bus publishes no key set to verify others with", "err", err)
		return nil
	}
	c.BusVerifier.Keys = keys
	c.Verifier = c.BusVerifier
	c.admitted, c.admittedClaims = "", nil
	go keys.watch(ctx, c.KeysInterval)
	return nil
}

// checkClaims applies the front end's own restriction (Tenant) to verified
// claims.
func (f *Front) checkClaims(c *token.Claims) error {
	if f.cfg.Tenant != "" && c.TenantID != f.cfg.Tenant {
		return api.NewError(api.PermissionDenied, api.ENotGranted,
			"the capability token is for tenant %q; this MCP endpoint serves tenant %q", c.TenantID, f.cfg.Tenant)
	}
	if f.cfg.agent != "" && c.AgentDID != f.cfg.agent {
		return api.NewError(api.PermissionDenied, api.ENotGranted,
			"the capability token is for agent %q; this MCP endpoint is connected as agent %q and serves its tokens only", c.AgentDID, f.cfg.agent)
	}
	return nil
}

// newSession makes the MCP server of one session: its tools are those c grants.
func (f *Front) newSession(id string, c *token.Claims, raw string) *session {
	s := &session{f: f, id: id, claims: c, raw: raw, listed: map[string]string{}, created: time.Now()}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.server = mcp.NewServer(&mcp.Implementation{Name: ServerName, Title: "toolgate", Version: control.Version}, &mcp.ServerOptions{
		Instructions: "Tools served by toolgate. Every call is checked against your capability token and policy, " +
			"may wait for a human's approval, and is audited. An error result says what was refused and what to do instead.",
		PageSize:     f.cfg.PageSize,
		GetSessionID: func() string { return id },
		//lint:ignore SA1019 logging/setLevel is part of the protocol revisions served (2025-06-18, 2025-11-25)
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}, Logging: &mcp.LoggingCapabilities{}},
		InitializedHandler: func(_ context.Context, r *mcp.InitializedRequest) {
			s.initialized.Store(true)
			ss := r.Session
			go func() { _ = ss.Wait(); f.drop(s) }()
		},
	})
	if !f.cfg.WaitApproval {
		s.server.AddTool(statusToolDef(), s.status)
	}
	s.refresh()
	return s
}

// register makes s one of the sessions the front end serves and keeps
// current.
func (f *Front) register(s *session) {
	f.mu.Lock()
	f.sessions[s.id] = s
	f.mu.Unlock()
}

// drop ends a session: its waiting calls are cancelled.
func (f *Front) drop(s *session) {
	f.mu.Lock()
	if f.sessions[s.id] == s {
		delete(f.sessions, s.id)
	}
	f.mu.Unlock()
	s.end()
}

func (f *Front) lookup(id string) *session {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sessions[id]
}
