package mcpfront_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/mcpfront"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/stages/execute/builtin"
	"github.com/toolgate/toolgate/stages/execute/kind"
)

const (
	testIssuer   = "toolgate"
	testAudience = "toolgate"
	tenant       = "acme"
	agent        = "did:agent:mcp-test"
)

var testKey = sync.OnceValue(func() *token.SigningKey {
	k, err := token.GenerateSigningKey(token.AlgEdDSA)
	if err != nil {
		panic(err)
	}
	return k
})

func verifier() *token.Verifier {
	return &token.Verifier{Keys: token.StaticKeys{Set: testKey().KeySet()}, Issuer: testIssuer, Audience: testAudience}
}

// mint signs c with the test key; an empty ToolID grants "t.*".
func mint(t testing.TB, c token.Claims) string {
	t.Helper()
	if c.TenantID == "" {
		c.TenantID = tenant
	}
	if c.AgentDID == "" {
		c.AgentDID = agent
	}
	if c.ToolID == nil {
		c.ToolID = token.Patterns{"t.*"}
	}
	c.Issuer, c.Audience = testIssuer, jwt.ClaimStrings{testAudience}
	c.ID = fmt.Sprintf("jti-%d", time.Now().UnixNano())
	if c.ExpiresAt == nil {
		c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(time.Hour))
	}
	raw, err := token.Mint(testKey(), c)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// The test tools: builtins the test controls.
var testTools = []string{
	`{"id":"t.echo","name":"Echo","version":"1.0.0","description":"Returns its arguments.","kind":"builtin","builtin":{"function":"echo"},
	  "input_schema":{"type":"object","required":["message"],"properties":{"message":{"type":"string","maxLength":64}},"additionalProperties":false},
	  "output_schema":{"type":"object"},"safety":{"risk_level":"low"}}`,
	`{"id":"t.write","name":"Write","version":"1.0.0","description":"Pretends to write.","kind":"builtin","builtin":{"function":"noop"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "safety":{"risk_level":"medium","side_effects":["fs.write"],"idempotent":true}}`,
	`{"id":"t.fetch","name":"Fetch","version":"1.0.0","description":"Pretends to fetch.","kind":"builtin","builtin":{"function":"noop"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "safety":{"risk_level":"low","side_effects":["network.http"]}}`,
	`{"id":"t.risky","name":"Risky","version":"1.0.0","description":"Needs a human.","kind":"builtin","builtin":{"function":"noop"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "safety":{"risk_level":"high","side_effects":["fs.delete"]}}`,
	`{"id":"t.progress","name":"Progress","version":"1.0.0","description":"Reports progress.","kind":"builtin","builtin":{"function":"progress"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},"limits":{"timeout_ms":60000}}`,
	`{"id":"t.slow","name":"Slow","version":"1.0.0","description":"Runs until cancelled.","kind":"builtin","builtin":{"function":"slow"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},"limits":{"timeout_ms":60000}}`,
	`{"id":"t.old","name":"Old","version":"1.0.0","description":"Superseded.","kind":"builtin","builtin":{"function":"noop"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},"lifecycle":{"state":"deprecated","deprecated_in_favor_of":"t.echo"}}`,
	`{"id":"other.tool","name":"Other","version":"1.0.0","description":"Not granted to t.* tokens.","kind":"builtin","builtin":{"function":"noop"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"}}`,
}

// env is a real toolgate (embedded NATS, all six stages) with an MCP front
// end over it.
type env struct {
	t      *testing.T
	url    string
	nc     *nats.Conn
	client *client.Client
	node   *node.Node
	front  *mcpfront.Front
	// slowStarted receives when t.slow starts; slowEnded when it sees its
	// context end. progressGo releases t.progress's steps.
	slowStarted chan struct{}
	slowEnded   chan struct{}
	progressGo  chan struct{}
	// chainKey is audit's chain key, which signs the results' receipts.
	chainKey ed25519.PrivateKey
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newEnv(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	ns, err := node.StartEmbedded(node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	e := &env{t: t, url: ns.ClientURL(), slowStarted: make(chan struct{}, 8), slowEnded: make(chan struct{}, 8),
		progressGo: make(chan struct{}, 8)}
	set := builtin.New(builtin.Env{})
	set["slow"] = func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		e.slowStarted <- struct{}{}
		<-ctx.Done()
		e.slowEnded <- struct{}{}
		return nil, ctx.Err()
	}
	set["progress"] = func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		p := kind.ProgressFrom(ctx)
		for i := 1; i <= 3; i++ {
			select {
			case <-e.progressGo:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			// toolgate records progress at most every 250 ms.
			time.Sleep(300 * time.Millisecond)
			p.Report(float64(i)*100/3, fmt.Sprintf("step %d of 3", i))
		}
		return json.RawMessage(`{"steps":3}`), nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	nodes := make(chan *node.Node, 1)
	errc := make(chan error, 1)
	cfg := node.Config{NATSURL: e.url, Workers: 2, Log: quiet(), Ready: func(_ string, n *node.Node) { nodes <- n }}
	cfg.Stage.Builtins = set
	cfg.Stage.Tokens = verifier()
	if _, e.chainKey, err = ed25519.GenerateKey(nil); err != nil {
		t.Fatal(err)
	}
	cfg.Stage.AuditChainKey = e.chainKey
	cfg.ApprovalSweep = 100 * time.Millisecond
	go func() { errc <- node.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("node.Run: %v", err)
		}
	})
	select {
	case e.node = <-nodes:
	case err := <-errc:
		t.Fatalf("toolgate did not start: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("toolgate did not start in time")
	}
	for _, doc := range testTools {
		e.register(doc)
	}
	if e.nc, err = nats.Connect(e.url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.nc.Close)
	if e.client, err = client.New(e.nc); err != nil {
		t.Fatal(err)
	}
	bus, err := mcpfront.NewNATSBus(ctx, e.nc, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if e.front, err = mcpfront.Start(ctx, mcpfront.Config{Bus: bus, Verifier: verifier(), Log: quiet(),
		StatusInterval: 50 * time.Millisecond, PageSize: 3, WaitApproval: true}); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) register(doc string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := e.node.Store.RegisterTool(ctx, []byte(doc), true)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.node.WaitForTool(ctx, m.ID, m.Version); err != nil {
		e.t.Fatal(err)
	}
}

// bearerTransport adds the capability token to every request.
type bearerTransport struct{ tok string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.tok)
	return http.DefaultTransport.RoundTrip(r)
}

// clientOpts lets a test observe what the server sends.
type observed struct {
	mu       sync.Mutex
	progress []*mcp.ProgressNotificationParams
	//lint:ignore SA1019 logging/setLevel is part of the protocol revisions served (2025-06-18, 2025-11-25)
	logs    []*mcp.LoggingMessageParams
	changed chan struct{}
}

func newObserved() *observed { return &observed{changed: make(chan struct{}, 16)} }

func (o *observed) options() *mcp.ClientOptions {
	return &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			o.mu.Lock()
			o.progress = append(o.progress, r.Params)
			o.mu.Unlock()
		},
		//lint:ignore SA1019 logging/setLevel is part of the protocol revisions served (2025-06-18, 2025-11-25)
		LoggingMessageHandler: func(_ context.Context, r *mcp.LoggingMessageRequest) {
			o.mu.Lock()
			o.logs = append(o.logs, r.Params)
			o.mu.Unlock()
		},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case o.changed <- struct{}{}:
			default:
			}
		},
	}
}

func (o *observed) progressMessages() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for _, p := range o.progress {
		out = append(out, fmt.Sprintf("%.0f:%s", p.Progress, p.Message))
	}
	return out
}

// transport names one way to reach the front end.
type transport string

const (
	overHTTP  transport = "http"
	overStdio transport = "stdio"
)

// connect opens an MCP session with the SDK's client over tr, with tok.
func (e *env) connect(tr transport, tok string, o *observed) *mcp.ClientSession {
	e.t.Helper()
	if o == nil {
		o = newObserved()
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "1"}, o.options())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var t mcp.Transport
	switch tr {
	case overHTTP:
		srv := httptest.NewServer(e.front.Handler())
		e.t.Cleanup(srv.Close)
		t = &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp", HTTPClient: &http.Client{Transport: bearerTransport{tok}}}
	case overStdio:
		ct, st := mcp.NewInMemoryTransports()
		sctx, scancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = e.front.ServeStdio(sctx, st, nil, tok) }()
		e.t.Cleanup(func() { scancel(); <-done })
		t = ct
	}
	cs, err := c.Connect(ctx, t, nil)
	if err != nil {
		e.t.Fatalf("connecting over %s: %v", tr, err)
	}
	e.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func listNames(t *testing.T, cs *mcp.ClientSession) map[string]*mcp.Tool {
	t.Helper()
	out := map[string]*mcp.Tool{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		out[tool.Name] = tool
	}
	return out
}

func text(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// toolgateError is the error a result carries in _meta.
func toolgateError(t *testing.T, r *mcp.CallToolResult) api.Error {
	t.Helper()
	var e api.Error
	b, _ := json.Marshal(r.Meta[mcpfront.MetaError])
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("result has no toolgate error: %v (%s)", err, text(r))
	}
	return e
}

// audited waits for the audit event that ends invocation id, and returns it.
func (e *env) audited(id string) map[string]any {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var found map[string]any
	err := e.client.Tail(ctx, tenant, true, func(_ string, data []byte) error {
		var ev struct {
			Data map[string]any `json:"data"`
		}
		if json.Unmarshal(data, &ev) == nil && ev.Data["invocation_id"] == id {
			if s, _ := ev.Data["status"].(string); api.Status(s).Terminal() {
				found = ev.Data
				return io.EOF
			}
		}
		return nil
	})
	if found == nil {
		e.t.Fatalf("no terminal audit event for %s: %v", id, err)
	}
	return found
}

func invocationOf(r *mcp.CallToolResult) string {
	s, _ := r.Meta[mcpfront.MetaInvocationID].(string)
	return s
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func busOf(t *testing.T, e *env) mcpfront.Bus {
	t.Helper()
	b, err := mcpfront.NewNATSBus(context.Background(), e.nc, quiet())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newHTTP(t *testing.T, e *env) string {
	srv := httptest.NewServer(e.front.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

// connectTo opens an HTTP session at url (a newHTTP server).
func (e *env) connectTo(url, tok string) *mcp.ClientSession {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: &http.Client{Transport: bearerTransport{tok}}}, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return cs
}
