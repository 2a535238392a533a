// Package httptool runs tools of kind http: one HTTP request per attempt,
// built from the manifest's templates and the call's parameters, confined to
// the hosts both the manifest and the capability token allow, with
// credentials from a secret source injected into headers and scrubbed from
// everything returned.
//
// The result is a JSON object:
//
//	{"status": 200, "url": "https://…", "headers": {"content-type": "…"}, "body": …}
//
// body is the response's JSON value, or its text, or (with "body_encoding":
// "base64") its bytes when they are not UTF-8; null when it is empty. A 429
// is rate_limit_exceeded and a 5xx external_api_error, both retryable with
// details.retry_after_ms from Retry-After; other 4xx are not retryable.
package httptool

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/hosts"
	"github.com/toolgate/toolgate/internal/secrets"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages/execute/kind"
)

// Secrets resolves a secret's value by name (secrets.Source does).
type Secrets = kind.Secrets

// Config configures the http kind.
type Config struct {
	// Secrets supplies credentials; nil refuses tools that need any.
	Secrets Secrets
	// DialTimeout bounds connecting (and the TLS handshake); default 10 s.
	// The whole request is bounded by the executor's time limit.
	DialTimeout time.Duration
	// AllowPrivateNetworks lets a granted host name resolve to a loopback,
	// private or link-local address. Off, only hosts granted as IP
	// literals reach such addresses.
	AllowPrivateNetworks bool
}

// Kind runs http tools. It implements execute.Kind.
type Kind struct {
	secrets   Secrets
	transport *http.Transport
}

// New returns a Kind sharing one connection pool across calls.
func New(c Config) *Kind {
	dial := c.DialTimeout
	if dial <= 0 {
		dial = 10 * time.Second
	}
	return &Kind{secrets: c.Secrets, transport: &http.Transport{
		// No proxy from the environment: the allowlist names where
		// requests and their credentials go, and a proxy would see both.
		Proxy:                  nil,
		DialContext:            dialPublic(&net.Dialer{Timeout: dial, KeepAlive: 30 * time.Second}, c.AllowPrivateNetworks),
		ForceAttemptHTTP2:      true,
		TLSHandshakeTimeout:    dial,
		ExpectContinueTimeout:  time.Second,
		IdleConnTimeout:        90 * time.Second,
		MaxIdleConnsPerHost:    8,
		MaxResponseHeaderBytes: 256 << 10,
	}}
}

// Close releases idle connections.
func (k *Kind) Close() { k.transport.CloseIdleConnections() }

// allowlist is where a call may connect: a host and port must match the
// manifest's permissions.network (when it lists any) and the token's grants.
type allowlist struct {
	tool     string
	declared []tools.NetworkPermission
	hosts    []string
	ports    []int
}

func newAllowlist(m *tools.Manifest, g envelope.Grants) allowlist {
	return allowlist{tool: m.Key(), declared: m.Permissions.Network, hosts: g.Hosts, ports: g.Ports}
}

// endpoint is a URL's lower-case host name and effective port.
func endpoint(u *url.URL) (string, int) {
	host := strings.ToLower(u.Hostname())
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		port = 80
		if u.Scheme == "https" {
			port = 443
		}
	}
	return host, port
}

func (a allowlist) check(u *url.URL) error {
	host, port := endpoint(u)
	reason := ""
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		reason = fmt.Sprintf("scheme %s is not http or https", u.Scheme)
	case len(a.declared) > 0 && !tools.DeclaresEndpoint(a.declared, host, port):
		reason = "the manifest's permissions.network does not list it"
	case !hosts.Any(a.hosts, host):
		reason = "the capability token does not grant the host"
	case len(a.ports) > 0 && !slices.Contains(a.ports, port):
		reason = "the capability token does not grant the port"
	default:
		return nil
	}
	return api.NewError(api.PermissionDenied, api.ENetworkPolicy, "%s may not connect to %s: %s",
		a.tool, net.JoinHostPort(host, strconv.Itoa(port)), reason).WithDetail("host", host).WithDetail("port", port)
}

// Target returns the host and port a call of the http tool m with params
// connects to first, for the authorize stage to hold against the token;
// ok is false when m is not an http tool or its URL cannot be built (the
// executor then refuses the call itself).
func Target(m *tools.Manifest, params json.RawMessage) (host string, port int, ok bool) {
	if m.Kind != "http" {
		return "", 0, false
	}
	s, err := decodeSpec(m)
	if err != nil {
		return "", 0, false
	}
	p, err := decodeParams(params)
	if err != nil {
		return "", 0, false
	}
	u, err := s.url.expand(p)
	if err != nil {
		return "", 0, false
	}
	host, port = endpoint(u)
	return host, port, true
}

// credential is a Credential with its secret resolved.
type credential struct {
	Credential
	value string
}

// Prepare implements execute.Kind: it checks the manifest's http object,
// resolves the credentials the token grants and returns one attempt.
func (k *Kind) Prepare(m *tools.Manifest, inv *envelope.Invocation) (kind.Func, error) {
	s, err := decodeSpec(m)
	if err != nil {
		return nil, err
	}
	var g envelope.Grants
	if inv.Authz != nil {
		g = inv.Authz.Grants
	}
	creds := make([]credential, 0, len(s.Credentials))
	var values []string
	for _, c := range s.Credentials {
		if !slices.Contains(g.Secrets, c.Secret) {
			return nil, api.NewError(api.PermissionDenied, api.ECredentialDenied,
				"%s needs credential %s, which the capability token does not grant", m.Key(), c.Secret).
				WithDetail("not_started", true)
		}
		if k.secrets == nil {
			return nil, unavailable(m, c.Secret, errors.New("no secret source is configured"))
		}
		v, err := k.secrets.Lookup(c.Secret)
		if err != nil {
			return nil, unavailable(m, c.Secret, err)
		}
		creds = append(creds, credential{Credential: c, value: v})
		values = append(values, v, c.Prefix+v)
	}
	c := &call{kind: k, m: m, spec: s, allow: newAllowlist(m, g), creds: creds, scrub: newScrubber(values...)}
	return c.run, nil
}

func unavailable(m *tools.Manifest, secret string, err error) error {
	// The cause is logged by no one and never reaches the wire: it may
	// name files.
	if SecretECode(err) == api.ESecretSourceUnreachable {
		return api.WrapError(err, api.ToolExecutionError, api.ESecretSourceUnreachable,
			"%s needs credential %s, and this worker's secrets directory cannot be read", m.Key(), secret).
			WithDetail("not_started", true).WithDetail("credential", secret)
	}
	return api.WrapError(err, api.ToolExecutionError, api.ECredentialUnavailable,
		"%s needs credential %s, which no secret source on this worker holds", m.Key(), secret).
		WithDetail("not_started", true).WithDetail("credential", secret)
}

// SecretECode is the E-code of a failed secret lookup: E3301 when the
// secrets directory cannot be read, so the secret may be there, else
// E3302.
func SecretECode(err error) string {
	if errors.Is(err, secrets.ErrUnreachable) {
		return api.ESecretSourceUnreachable
	}
	return api.ECredentialUnavailable
}

// call is one invocation's prepared request.
type call struct {
	kind  *Kind
	m     *tools.Manifest
	spec  *spec
	allow allowlist
	creds []credential
	scrub *scrubber
}

// maxRedirects matches net/http's default.
const maxRedirects = 10

func (c *call) run(ctx context.Context, raw json.RawMessage) (json.RawMessage, error) {
	params, err := decodeParams(raw)
	if err != nil {
		return nil, err
	}
	u, err := c.spec.url.expand(params)
	if err != nil {
		return nil, err
	}
	if err := c.allow.check(u); err != nil {
		return nil, api.AsError(err).WithDetail("not_started", true)
	}
	req, err := c.request(ctx, u, params, raw)
	if err != nil {
		return nil, err
	}
	var connected atomic.Bool
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { connected.Store(true) },
	}))
	client := &http.Client{Transport: c.kind.transport, CheckRedirect: c.redirect}
	resp, err := client.Do(req)
	if err != nil {
		return nil, c.failed(ctx, err, !connected.Load())
	}
	defer resp.Body.Close()
	if err := c.status(resp); err != nil {
		_, _ = io.CopyN(io.Discard, resp.Body, 4<<10) // lets the connection be reused
		return nil, err
	}
	return c.result(ctx, resp)
}

func decodeParams(raw json.RawMessage) (map[string]json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return map[string]json.RawMessage{}, nil
	}
	var p map[string]json.RawMessage
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, badParams("parameters are not a JSON object")
	}
	return p, nil
}

// request builds the request: URL, headers, body, then credentials, which
// no template can override.
func (c *call) request(ctx context.Context, u *url.URL, params map[string]json.RawMessage, raw json.RawMessage) (*http.Request, error) {
	var body []byte
	switch {
	case c.spec.BodyFromParameters:
		body = bytes.TrimSpace(raw)
		if len(body) == 0 {
			body = []byte("{}")
		}
	case c.spec.body != nil:
		v, _, err := expandBody(c.spec.body, params)
		if err != nil {
			return nil, err
		}
		if body, err = json.Marshal(v); err != nil {
			return nil, badParams("body: %v", err)
		}
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, c.spec.Method, u.String(), rd)
	if err != nil {
		return nil, badParams("building the request: %v", err)
	}
	for name, tpl := range c.spec.Headers {
		v, err := expandText(tpl, params)
		if err != nil {
			return nil, err
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return nil, badParams("header %s would hold a line break", name)
		}
		req.Header.Set(name, v)
	}
	if body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", "toolgate")
	}
	for _, cr := range c.creds {
		req.Header.Set(cr.Header, cr.Prefix+cr.value)
	}
	return req, nil
}

// redirect is the client's CheckRedirect: every hop must stay within the
// allowlist, and credentials do not follow a hop to another host.
func (c *call) redirect(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects {
		return api.NewError(api.ExternalAPIError, api.EExternalStatus, "%s: stopped after %d redirects", c.m.Key(), maxRedirects)
	}
	if err := c.allow.check(req.URL); err != nil {
		te := api.AsError(err)
		te.Message += " (redirected by " + via[len(via)-1].URL.Host + ")"
		return te.WithDetail("redirect", true)
	}
	h0, p0 := endpoint(via[0].URL)
	if h, p := endpoint(req.URL); h != h0 || p != p0 {
		for _, cr := range c.creds {
			req.Header.Del(cr.Header)
		}
	}
	return nil
}

// failed classifies an error from the client: a refused redirect keeps its
// code, an ended context is left for the executor (timeout, cancel), and
// the rest is an unreachable service, retryable.
func (c *call) failed(ctx context.Context, err error, notStarted bool) error {
	var te *api.Error
	if errors.As(err, &te) {
		te.Message = c.scrub.String(te.Message)
		return te
	}
	var pe *privateAddrError
	if errors.As(err, &pe) {
		return api.NewError(api.PermissionDenied, api.ENetworkPolicy, "%s: %v", c.m.Key(), pe).
			WithDetail("not_started", true)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return api.NewError(api.ExternalAPIError, api.EExternalUnreachable, "%s: %s", c.m.Key(), c.scrub.String(err.Error())).
		AsRetryable().WithDetail("not_started", notStarted)
}

// status turns an error status into its error.
func (c *call) status(resp *http.Response) error {
	code := resp.StatusCode
	if code < 400 {
		return nil
	}
	var e *api.Error
	switch {
	case code == http.StatusTooManyRequests:
		// A 429 refuses the request before acting on it (RFC 6585), so even
		// a tool that is not idempotent may be sent again.
		e = api.NewError(api.RateLimitExceeded, api.ERateLimited, "%s: the service answered %d (rate limited)", c.m.Key(), code).
			AsRetryable().WithDetail("not_started", true)
	case code >= 500:
		e = api.NewError(api.ExternalAPIError, api.EExternalStatus, "%s: the service answered %d", c.m.Key(), code).AsRetryable()
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		e = api.NewError(api.ExternalAPIError, api.EExternalAuth, "%s: the service refused the request (%d)", c.m.Key(), code)
	default:
		e = api.NewError(api.ExternalAPIError, api.EExternalStatus, "%s: the service answered %d", c.m.Key(), code)
	}
	e.WithDetail("status", code)
	if e.Retryable {
		if ms, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			e.WithDetail("retry_after_ms", ms)
		}
	}
	return e
}

// retryAfter reads Retry-After: delay seconds or an HTTP date.
func retryAfter(v string, now time.Time) (int64, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	const ceiling = 24 * time.Hour // a bound, so nothing overflows
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		return min(time.Duration(min(n, int64(ceiling/time.Second)))*time.Second, ceiling).Milliseconds(), true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return min(max(t.Sub(now), 0), ceiling).Milliseconds(), true
}

// result reads the body within the bound and builds the result object.
func (c *call) result(ctx context.Context, resp *http.Response) (json.RawMessage, error) {
	limit := c.spec.maxBytes(c.m)
	if resp.ContentLength > limit {
		return nil, c.tooLarge(limit)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, api.NewError(api.ExternalAPIError, api.EExternalUnreachable, "%s: reading the response: %s",
			c.m.Key(), c.scrub.String(err.Error())).AsRetryable()
	}
	if int64(len(data)) > limit {
		return nil, c.tooLarge(limit)
	}
	out := struct {
		Status       int               `json:"status"`
		URL          string            `json:"url"`
		Headers      map[string]string `json:"headers"`
		Body         any               `json:"body"`
		BodyEncoding string            `json:"body_encoding,omitempty"`
	}{Status: resp.StatusCode, URL: c.scrub.String(resp.Request.URL.String()), Headers: map[string]string{}}
	for _, name := range append([]string{"Content-Type"}, c.spec.ResponseHeaders...) {
		if vs := resp.Header.Values(name); len(vs) > 0 {
			out.Headers[strings.ToLower(name)] = c.scrub.String(strings.Join(vs, ", "))
		}
	}
	asJSON := c.spec.Response == "json" || c.spec.Response == "auto" && isJSON(resp.Header.Get("Content-Type"))
	switch {
	case len(data) == 0:
		if c.spec.Response == "json" && c.spec.Method != "HEAD" && resp.StatusCode != http.StatusNoContent {
			return nil, c.malformed("the response body is empty")
		}
	case asJSON:
		v, err := decodeJSON(data)
		if err == nil {
			out.Body = c.scrub.JSON(v)
			break
		}
		if c.spec.Response == "json" {
			return nil, c.malformed("the response body is not JSON")
		}
		fallthrough
	case utf8.Valid(data):
		out.Body = c.scrub.String(string(data))
	default:
		if c.spec.Response == "json" {
			return nil, c.malformed("the response body is not JSON")
		}
		// Scrubbed before encoding, so no encoded secret survives.
		out.Body = base64.StdEncoding.EncodeToString([]byte(c.scrub.String(string(data))))
		out.BodyEncoding = "base64"
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		return nil, api.WrapError(err, api.ToolExecutionError, api.EToolFailed, "%s: encoding the result: %v", c.m.Key(), err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

func (c *call) tooLarge(limit int64) error {
	return api.NewError(api.ResourceExhausted, api.EResourceLimit,
		"%s: the response exceeds %d bytes (max_response_bytes)", c.m.Key(), limit).
		WithDetail("limit", "max_response_bytes").WithDetail("max_bytes", limit)
}

func (c *call) malformed(msg string) error {
	return api.NewError(api.ExternalAPIError, api.EExternalMalformed, "%s: %s", c.m.Key(), msg)
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// decodeJSON decodes exactly one JSON value, keeping numbers as written.
func decodeJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the JSON value")
	}
	return v, nil
}
