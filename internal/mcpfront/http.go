package mcpfront

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/token"
)

type claimsKey struct{}

type authed struct {
	claims *token.Claims
	raw    string
	// initialize: the request is an initialize, which opens a session.
	initialize bool
	opened     *session // the server made for this request, if any
}

// Handler serves MCP over streamable HTTP. Every request must carry
// `Authorization: Bearer <capability token>`; without one, or with a token
// that does not verify, is for another tenant than Config.Tenant, or for
// another tenant or agent than the session it names, the answer is 401 with
// a `WWW-Authenticate: Bearer` challenge and a JSON body
// {"error", "error_description", "code", "e_code"}.
func (f *Front) Handler() http.Handler {
	h := mcp.NewStreamableHTTPHandler(f.serverFor, &mcp.StreamableHTTPOptions{
		Logger:         f.cfg.Log,
		SessionTimeout: f.cfg.SessionTimeout,
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, ok := bearer(r.Header.Get("Authorization"))
		if !ok {
			unauthorized(w, "invalid_request", api.NewError(api.PermissionDenied, api.ETokenInvalid,
				"send the capability token as Authorization: Bearer <token>"))
			return
		}
		var sess *session
		if sid := r.Header.Get("Mcp-Session-Id"); sid != "" {
			sess = f.lookup(sid)
		}
		claims, err := f.verify(raw, sess)
		if err == nil {
			err = f.checkClaims(claims)
		}
		if err == nil && sess != nil && (sess.claims.TenantID != claims.TenantID || sess.claims.AgentDID != claims.AgentDID) {
			err = api.NewError(api.PermissionDenied, api.ENotGranted,
				"the session belongs to another tenant or agent than this capability token")
		}
		if err != nil {
			unauthorized(w, "invalid_token", api.AsError(err))
			return
		}
		if r.Method == http.MethodDelete {
			// The SDK closes a deleted session only once its calls have
			// returned: end them first, so DELETE cancels them.
			if s := f.lookup(r.Header.Get("Mcp-Session-Id")); s != nil {
				f.drop(s)
			}
		}
		a := &authed{claims: claims, raw: raw}
		var reply *callReply
		// Only the front end sets the request id header (see requestIDHeader).
		r.Header.Del(requestIDHeader)
		if r.Method == http.MethodPost && r.Body != nil {
			body, err := io.ReadAll(io.LimitReader(r.Body, mcp.DefaultMaxRequestBodyBytes+1))
			if err != nil {
				http.Error(w, "reading the request body", http.StatusBadRequest)
				return
			}
			if len(body) <= mcp.DefaultMaxRequestBodyBytes {
				fields, _ := jsonFields(body) // read once for both
				if id, ok := cancelledIn(fields); ok {
					f.withdrawn.add(r.Header.Get("Mcp-Session-Id") + " " + id)
				}
				if m, ok := envelopeOf(fields); ok {
					if m.unknown() {
						methodNotFound(w, m.ID, *m.Method)
						return
					}
					reply = &callReply{w: w}
					a.initialize = *m.Method == "initialize"
					if *m.Method == "tools/call" {
						if id, ok := canonicalID(m.ID); ok {
							r.Header.Set(requestIDHeader, id)
							reply.call = r.Header.Get("Mcp-Session-Id") + " " + id
							reply.withdrawn = &f.withdrawn
						}
					}
				}
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
		}
		ctx := context.WithValue(r.Context(), claimsKey{}, a)
		if reply == nil {
			h.ServeHTTP(w, r.WithContext(ctx))
			return
		}
		if reply.call != "" {
			f.live.expect(reply.call)
		}
		h.ServeHTTP(reply, r.WithContext(ctx))
		if reply.call != "" {
			// The request's context ends before ServeHTTP returns only
			// when the client's connection closed.
			f.live.closed(reply.call, r.Context().Err() != nil)
		}
		reply.finish()
	})
}

// callReply is the response writer of a POST that carries one call. The SDK
// answers a call with an event stream. callReply holds the stream's first
// event back: when that is the call's response, nothing having come before
// it, the response goes out as application/json instead (one write, and no
// stream for the client to read); when a notification or a request comes
// first (progress, the approval notice), the stream goes out as the SDK
// writes it, so what concerns the call travels on the call's own response.
// Either answer is the client's to accept (streamable HTTP, "Sending
// Messages to the Server").
type callReply struct {
	w  http.ResponseWriter
	mu sync.Mutex
	// status is a 200 the SDK wrote before anything was decided.
	status int
	// event is the held first event, data its JSON-RPC message.
	event, data []byte
	passing     bool // the SDK's writes go straight out
	finished    bool // the handler has returned
	// call ("<session id> <request id>") is kept back, response and all,
	// once it is in withdrawn: the client cancelled it.
	call      string
	withdrawn *withdrawn
	dropped   bool
}

// cancelledCall reports whether a response event (isResponse) is that of
// a call the client cancelled.
func (c *callReply) cancelledCall(isResponse bool) bool {
	return isResponse && c.withdrawn != nil && c.withdrawn.take(c.call)
}

var errReplied = errors.New("the response to this request has been sent")

func (c *callReply) Header() http.Header { return c.w.Header() }

// Unwrap lets http.ResponseController reach the connection's writer.
func (c *callReply) Unwrap() http.ResponseWriter { return c.w }

func (c *callReply) WriteHeader(code int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.passing && !c.finished && code == http.StatusOK && c.status == 0 && c.event == nil && isEventStream(c.w.Header()) {
		c.status = code
		return
	}
	c.passLocked()
	c.w.WriteHeader(code)
}

func (c *callReply) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.finished {
		return 0, errReplied
	}
	hold := !c.passing && c.event == nil && isEventStream(c.w.Header())
	var data []byte
	var isResponse bool
	if hold || c.withdrawn != nil {
		data, isResponse = responseEvent(b) // one parse for both questions
	}
	if c.cancelledCall(isResponse) {
		c.dropped = true
		return len(b), nil
	}
	if hold && isResponse {
		c.event = bytes.Clone(b)
		c.data = c.event[len(b)-len(data)-2 : len(b)-2]
		return len(b), nil
	}
	c.passLocked()
	return c.w.Write(b)
}

// Flush sends what passes through; a held response waits for finish.
func (c *callReply) Flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.passing && !c.finished {
		_ = http.NewResponseController(c.w).Flush()
	}
}

// passLocked makes the answer the SDK's event stream, with the event held
// so far.
func (c *callReply) passLocked() {
	if c.passing {
		return
	}
	c.passing = true
	if c.status != 0 {
		c.w.WriteHeader(c.status)
	}
	if c.event != nil {
		_, _ = c.w.Write(c.event)
	}
}

// finish sends a held response as application/json.
func (c *callReply) finish() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.finished = true
	if c.dropped && !c.passing {
		// Nothing went out: an empty answer, no response in it.
		c.w.WriteHeader(http.StatusAccepted)
		return
	}
	if c.passing || c.event == nil {
		return
	}
	h := c.w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Connection")
	h.Set("Content-Length", strconv.Itoa(len(c.data)))
	c.w.WriteHeader(http.StatusOK)
	_, _ = c.w.Write(c.data)
}

func isEventStream(h http.Header) bool {
	return h.Get("Content-Type") == "text/event-stream"
}

// responseEvent is the message of an SSE event as the SDK writes a message
// without an event id ("event: message", one data line), when that message
// is a JSON-RPC response.
func responseEvent(ev []byte) ([]byte, bool) {
	rest, ok := bytes.CutPrefix(ev, []byte("event: message\ndata: "))
	if !ok {
		return nil, false
	}
	data, ok := bytes.CutSuffix(rest, []byte("\n\n"))
	if !ok || bytes.IndexByte(data, '\n') >= 0 {
		return nil, false
	}
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method *string         `json:"method"`
	}
	if json.Unmarshal(data, &m) != nil || m.Method != nil || len(m.ID) == 0 {
		return nil, false
	}
	return data, true
}

// serverFor gives the SDK the server of a request's session. The SDK asks
// on every request (for the protocol versions a server speaks) and once
// more when a request without a session id opens one, so: a known
// session's own server; for a session id it does not know (which the SDK
// answers 404), one shared server with no tools; and for a request without
// one, a server of its own, kept as a session only for an initialize (and
// dropped if the client never finishes the handshake): the probes clients
// send before it (server/discover) open nothing.
func (f *Front) serverFor(r *http.Request) *mcp.Server {
	a, ok := r.Context().Value(claimsKey{}).(*authed)
	if !ok {
		return nil
	}
	if sid := r.Header.Get("Mcp-Session-Id"); sid != "" {
		if s := f.lookup(sid); s != nil {
			return s.server
		}
		return f.unknownSession()
	}
	if a.opened == nil {
		s := f.newSession(uuid.NewString(), a.claims, a.raw)
		a.opened = s
		if a.initialize {
			f.register(s)
			time.AfterFunc(time.Minute, func() {
				if !s.initialized.Load() {
					f.drop(s)
				}
			})
		}
	}
	return a.opened.server
}

// verify checks a request's token. A request of a session that carries the
// very token the session was opened with needs no signature check again,
// only the clock's: the token is the same bytes, verified before.
func (f *Front) verify(raw string, s *session) (*token.Claims, error) {
	c, err := f.verifyToken(raw, s)
	if err != nil {
		return nil, err
	}
	if e := f.refused.Load(); e != nil {
		return nil, e
	}
	if jti, ok := f.revoked.Revoked(c); ok {
		if s != nil {
			f.drop(s)
		}
		return nil, api.NewError(api.PermissionDenied, api.ETokenRevoked, "the capability token %s is revoked", jti)
	}
	return c, nil
}

func (f *Front) verifyToken(raw string, s *session) (*token.Claims, error) {
	if f.cfg.Verifier == nil {
		return f.admittedToken(raw)
	}
	if s == nil || s.raw != raw || s.claims.ExpiresAt == nil {
		return f.cfg.Verifier.Verify(raw)
	}
	now := time.Now()
	if f.cfg.Verifier.Now != nil {
		now = f.cfg.Verifier.Now()
	}
	if !now.Before(s.claims.ExpiresAt.Add(f.cfg.Verifier.Leeway)) {
		return f.cfg.Verifier.Verify(raw) // says why, as for any expired token
	}
	return s.claims, nil
}

// bearer extracts the token of an Authorization header value.
func bearer(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// unauthorized answers 401 with an RFC 6750 challenge.
func unauthorized(w http.ResponseWriter, code string, e *api.Error) {
	desc := strings.NewReplacer(`"`, "'", "\\", "/").Replace(e.Message)
	w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="toolgate", error="%s", error_description="%s"`, code, desc))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"error": code, "error_description": e.Message, "code": e.Code, "e_code": e.ECode,
	})
}

// serverMethods are the requests an MCP server answers (the SDK's list).
var serverMethods = map[string]bool{
	"initialize": true, "ping": true, "tools/list": true, "tools/call": true, "logging/setLevel": true,
	"prompts/list": true, "prompts/get": true, "resources/list": true, "resources/read": true,
	"resources/templates/list": true, "resources/subscribe": true, "resources/unsubscribe": true,
	"completion/complete": true, "server/discover": true, "subscriptions/listen": true,
}

// envelope is what the front end reads of a POSTed JSON-RPC message.
type envelope struct {
	ID     json.RawMessage `json:"id"`
	Method *string         `json:"method"`
}

// parseEnvelope reads a JSON-RPC request that is a call (has an id); a
// notification, a response, a batch or anything else is not one.
func parseEnvelope(body []byte) (envelope, bool) {
	fields, ok := jsonFields(body)
	if !ok {
		return envelope{}, false
	}
	return envelopeOf(fields)
}

// jsonFields are the members of a JSON-RPC message, by their exact keys.
// The keys are matched exactly, as the SDK matches them: decoding into a
// struct would also take "ID" or "Method", and read a call where the SDK
// reads a notification, or a method the SDK does not.
func jsonFields(body []byte) (map[string]json.RawMessage, bool) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil || fields == nil {
		return nil, false
	}
	return fields, true
}

// envelopeOf is parseEnvelope of a message's members (jsonFields).
func envelopeOf(fields map[string]json.RawMessage) (envelope, bool) {
	var m envelope
	rawMethod, hasMethod := fields["method"]
	m.ID = fields["id"]
	if !hasMethod || len(m.ID) == 0 || string(m.ID) == "null" || json.Unmarshal(rawMethod, &m.Method) != nil || m.Method == nil {
		return envelope{}, false
	}
	return m, true
}

// unknown reports a method no MCP server has. Over streamable HTTP the SDK
// answers those with a bare 400; the spec asks for the JSON-RPC error
// -32601, as over stdio.
func (m envelope) unknown() bool {
	return !serverMethods[*m.Method] && !strings.HasPrefix(*m.Method, "notifications/")
}

// cancelledIn reads the request id of a notifications/cancelled from its
// members (jsonFields).
func cancelledIn(fields map[string]json.RawMessage) (string, bool) {
	var method string
	if _, hasID := fields["id"]; hasID || json.Unmarshal(fields["method"], &method) != nil || method != "notifications/cancelled" {
		return "", false
	}
	return cancelledID(fields["params"])
}

// canonicalID is a JSON-RPC id as the SDK tells requests apart: a string,
// or a number as an integer, in JSON.
func canonicalID(raw json.RawMessage) (string, bool) {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return "", false
	}
	switch v := v.(type) {
	case string:
		b, err := json.Marshal(v)
		return string(b), err == nil
	case float64:
		return strconv.FormatInt(int64(v), 10), true
	}
	return "", false
}

func methodNotFound(w http.ResponseWriter, id json.RawMessage, method string) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"jsonrpc": "2.0", "id": id,
		"error": map[string]any{"code": jsonrpc.CodeMethodNotFound, "message": fmt.Sprintf("method not found: %q", method)},
	})
}

// admittedToken checks a request's token when the front end has no key set
// and is connected as one agent: only that agent's very token is served,
// the one the bus verified when it admitted the connection (and whose
// revocation closes it, see busRefused); the pipeline verifies it again on
// every call.
func (f *Front) admittedToken(raw string) (*token.Claims, error) {
	c := f.cfg.admittedClaims
	if f.cfg.admitted == "" || c == nil || subtle.ConstantTimeCompare([]byte(raw), []byte(f.cfg.admitted)) != 1 {
		return nil, api.NewError(api.PermissionDenied, api.ENotGranted,
			"this MCP endpoint has no key set to verify tokens with: it serves only the capability token it connected to toolgate with (start it with --jwks to serve other tokens)")
	}
	if c.ExpiresAt != nil && !time.Now().Before(c.ExpiresAt.Time) {
		return nil, api.NewError(api.PermissionDenied, api.ETokenExpired, "the capability token expired at %s", c.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return c, nil
}
