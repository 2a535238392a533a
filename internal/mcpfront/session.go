package mcpfront

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
)

// session is one MCP session: its server, the token it was opened with, and
// the tools it lists.
type session struct {
	f      *Front
	id     string
	claims *token.Claims
	raw    string // the token calls carry when the request has none of its own
	server *mcp.Server
	// created is when the session was opened.
	created time.Time
	// initialized is set once the client has finished the handshake.
	initialized atomic.Bool

	// ctx ends with the session; every call waits under it.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	listed map[string]string // MCP tool name → signature of what is listed
}

func (s *session) end() { s.cancel() }

// refresh makes the server's tools those the session's token grants now.
func (s *session) refresh() {
	want := map[string]*tools.Manifest{}
	for _, m := range s.f.cfg.Bus.Tools() {
		if !grants(s.claims, m) || ToolName(m.ID) == StatusTool {
			continue
		}
		want[ToolName(m.ID)] = m
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var gone []string
	for name := range s.listed {
		if _, ok := want[name]; !ok {
			gone = append(gone, name)
		}
	}
	if len(gone) > 0 {
		slices.Sort(gone)
		s.server.RemoveTools(gone...)
		for _, name := range gone {
			delete(s.listed, name)
		}
	}
	names := make([]string, 0, len(want))
	for name := range want {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		m := want[name]
		sig := signature(m)
		if s.listed[name] == sig {
			continue
		}
		s.listed[name] = sig
		s.server.AddTool(describe(name, m), s.handler(m.ID))
	}
}

// grants reports whether c may call m: the token's own grant check (tenant,
// agent, tool pattern, version range, operation) and its excluded side
// effects. Policy, approvals and budgets are decided per call.
func grants(c *token.Claims, m *tools.Manifest) bool {
	if c.Grants(token.Binding{Tenant: c.TenantID, AgentDID: c.AgentDID, SessionID: c.SessionID,
		ToolID: m.ID, ToolVersion: m.Version}) != nil {
		return false
	}
	for _, se := range m.Safety.SideEffects {
		for _, ex := range c.ExcludedSideEffects {
			if se == ex || strings.HasPrefix(se, ex+".") {
				return false
			}
		}
	}
	return true
}

// signature changes whenever what tools/list shows of m changes.
func signature(m *tools.Manifest) string {
	// The whole manifest: a version replaced (an imported tool's accepted
	// change) keeps its key, and updated_at is to the second.
	b, err := json.Marshal(m)
	if err != nil {
		return m.Key() + "|" + m.Lifecycle.State + "|" + m.Lifecycle.DeprecatedInFavorOf
	}
	sum := sha256.Sum256(b)
	return string(sum[:])
}

// ToolName is the MCP name of a tool id: the id with every character MCP
// does not allow in a name (A-Z a-z 0-9 _ - .) replaced by '_', so
// mcp:fs:write_file is listed as mcp_fs_write_file.
func ToolName(id string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-', r == '.':
			return r
		}
		return '_'
	}, id)
}

// stdioClaims reads the claims of a stdio session's token: verified when a
// key set is at hand, else only decoded (toolgate verifies every call; the
// claims then only shape tools/list and the connection's inbox).
func stdioClaims(v *token.Verifier, raw string) (*token.Claims, error) {
	if v != nil {
		return v.Verify(raw)
	}
	var c token.Claims
	if _, _, err := jwt.NewParser().ParseUnverified(raw, &c); err != nil {
		return nil, fmt.Errorf("decoding the capability token: %w", err)
	}
	return &c, nil
}

// ServeStdio serves one session over t (standard input and output, or an
// in-memory transport in tests) with the token raw, until the client closes
// it or ctx ends. claims nil verifies raw with the Verifier.
func (f *Front) ServeStdio(ctx context.Context, t mcp.Transport, claims *token.Claims, raw string) error {
	if claims == nil {
		var err error
		if claims, err = stdioClaims(f.cfg.Verifier, raw); err != nil {
			return fmt.Errorf("capability token: %w", err)
		}
	}
	if err := f.checkClaims(claims); err != nil {
		return err
	}
	s := f.newSession("stdio-"+uuid.NewString(), claims, raw)
	f.register(s)
	defer f.drop(s)
	ss, err := s.server.Connect(ctx, tagging{t}, nil)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = ss.Close() })
	defer stop()
	return ss.Wait()
}

// requestIDHeader carries a tools/call request's JSON-RPC id, which the SDK
// does not hand a tool handler, in the request's RequestExtra: over HTTP the
// front end's handler sets it on the POST that carries the request (and
// removes any the client sent); over stdio taggingConn adds it.
const requestIDHeader = "X-Toolgate-Request-Id"

// tagging wraps a transport so that each tools/call request carries its id
// (see requestIDHeader).
type tagging struct{ mcp.Transport }

func (t tagging) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &taggingConn{Connection: c, withdrawn: withdrawn{}}, nil
}

// taggingConn tags tools/call requests with their id, and keeps back the
// response to a request the client cancelled: the SDK answers every
// request, cancelled or not, and a client that has forgotten the id
// reports such an answer as an error of its own.
type taggingConn struct {
	mcp.Connection
	withdrawn withdrawn
}

// withdrawn holds the ids (canonicalID) of requests the client cancelled
// whose response has not been kept back yet.
type withdrawn struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (w *withdrawn) add(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ids == nil {
		w.ids = map[string]bool{}
	}
	w.ids[id] = true
}

// take reports whether id was cancelled, forgetting it.
func (w *withdrawn) take(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	ok := w.ids[id]
	delete(w.ids, id)
	return ok
}

// cancelledID is the request id a notifications/cancelled names.
func cancelledID(params json.RawMessage) (string, bool) {
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil || len(p.RequestID) == 0 {
		return "", false
	}
	return canonicalID(p.RequestID)
}

func (c *taggingConn) Write(ctx context.Context, m jsonrpc.Message) error {
	if resp, ok := m.(*jsonrpc.Response); ok && resp.ID.IsValid() {
		if raw, err := json.Marshal(resp.ID.Raw()); err == nil {
			if id, ok := canonicalID(raw); ok && c.withdrawn.take(id) {
				return nil
			}
		}
	}
	return c.Connection.Write(ctx, m)
}

func (c *taggingConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	m, err := c.Connection.Read(ctx)
	if req, ok := m.(*jsonrpc.Request); ok && err == nil && req.Method == "notifications/cancelled" && !req.ID.IsValid() {
		if id, ok := cancelledID(req.Params); ok {
			c.withdrawn.add(id)
		}
	}
	if req, ok := m.(*jsonrpc.Request); ok && err == nil && req.Method == "tools/call" && req.ID.IsValid() {
		if id, err := json.Marshal(req.ID.Raw()); err == nil {
			var extra mcp.RequestExtra
			if e, ok := req.Extra.(*mcp.RequestExtra); ok && e != nil {
				extra = *e
			}
			extra.Header = extra.Header.Clone()
			if extra.Header == nil {
				extra.Header = http.Header{}
			}
			extra.Header.Set(requestIDHeader, string(id))
			req.Extra = &extra
		}
	}
	return m, err
}
