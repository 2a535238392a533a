package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/stages/execute/builtin"
	"github.com/toolgate/toolgate/stages/execute/kind"
	"github.com/toolgate/toolgate/subjects"
)

// env is a real embedded NATS server with toolgate's topology, shared by the
// pieces of one test.
type env struct {
	t       testing.TB
	url     string
	dataDir string // the embedded server's store
	nc      *nats.Conn
	js      jetstream.JetStream
	client  *client.Client
	topo    topology.TopologyOptions
	// gate holds the "block" builtin until closed.
	gate    chan struct{}
	started chan string // receives the invocation parameter "n" when block starts
	blocks  atomic.Int32
	// holding counts the "hold" builtin's calls running, and holdingBy by
	// their parameters; each holds until gate closes.
	holding   atomic.Int32
	holdingBy sync.Map // string → *atomic.Int32
	// steps counts the runs of each step of the "steps" builtin; stepped
	// receives each step number as it completes.
	steps   [32]atomic.Int32
	stepped chan int
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newEnv(t testing.TB, topo topology.TopologyOptions) *env {
	t.Helper()
	e, _ := newEnvAt(t, topo, "127.0.0.1:-1")
	return e
}

// newEnvAt is newEnv with its server listening on listen; restart stops
// the server and starts it again on the same store and address (what is
// in memory is lost, as in a power cut), and the env's connections
// reconnect.
func newEnvAt(t testing.TB, topo topology.TopologyOptions, listen string) (e *env, restart func()) {
	t.Helper()
	dataDir := t.TempDir()
	opts := node.EmbeddedOptions{Listen: listen, DataDir: dataDir}
	ns, err := node.StartEmbedded(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	restart = func() {
		ns.Shutdown()
		ns.WaitForShutdown()
		if ns, err = node.StartEmbedded(opts); err != nil {
			t.Fatal(err)
		}
	}
	// The deployment's hop-sealing key: every pipeline of the env seals
	// and checks hops with it.
	if _, err := busauth.LoadOrCreateSealKey(dataDir); err != nil {
		t.Fatal(err)
	}
	e = &env{t: t, url: ns.ClientURL(), dataDir: dataDir, topo: topo, gate: make(chan struct{}), started: make(chan string, 16),
		stepped: make(chan int, 64)}
	t.Cleanup(func() { e.release() })
	e.nc = e.connect()
	if e.js, err = jetstream.New(e.nc); err != nil {
		t.Fatal(err)
	}
	if e.client, err = client.New(e.nc); err != nil {
		t.Fatal(err)
	}
	return e, restart
}

// sealed returns c with the env's hop-sealing key: authorize seals with
// it, execute checks with it, as in the pipelines startPipeline runs.
func (e *env) sealed(c node.StageConfig) node.StageConfig {
	e.t.Helper()
	k, err := busauth.LoadSealKey(e.dataDir)
	if err != nil {
		e.t.Fatal(err)
	}
	c.Sealer = seal.NewSealer(k)
	c.Seals = seal.NewVerifier(c.Sealer.Public())
	harnessDefaults(&c)
	return c
}

// harnessDefaults declares what this package's tests need where they say
// nothing: they fire many calls of one agent at once and in quick
// succession, which the specification's rate limit and count of running
// calls per agent would refuse. The tests of those defaults set them
// (TestSeedDefaultLimits).
func harnessDefaults(c *node.StageConfig) {
	if c.Defaults == (tools.Defaults{}) {
		c.Defaults = tools.Defaults{RateLimit: &tools.RateLimit{Requests: 1_000_000, PerSeconds: 1, Burst: 1_000_000},
			ConcurrentToolsPerAgent: tools.UncountedRuns}
	}
}

var releaseOnce sync.Map

func (e *env) release() {
	if _, loaded := releaseOnce.LoadOrStore(e, true); !loaded {
		close(e.gate)
	}
}

func (e *env) connect() *nats.Conn {
	nc, err := nats.Connect(e.url)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(nc.Close)
	return nc
}

// builtins is the standard set plus tools that misbehave on purpose.
func (e *env) builtins(root string) builtin.Set {
	set := builtin.New(builtin.Env{FileRoot: root})
	set["boom"] = func(context.Context, json.RawMessage) (json.RawMessage, error) { panic("boom") }
	set["bad_output"] = func(context.Context, json.RawMessage) (json.RawMessage, error) {
		return json.RawMessage(`{"unexpected":true}`), nil
	}
	// maybe fails when asked to.
	set["maybe"] = func(_ context.Context, p json.RawMessage) (json.RawMessage, error) {
		var in struct {
			Fail bool `json:"fail"`
		}
		_ = json.Unmarshal(p, &in)
		if in.Fail {
			return nil, api.NewError(api.ToolExecutionError, api.EToolFailed, "failed as asked")
		}
		return json.RawMessage(`{}`), nil
	}
	// flaky fails twice per distinct parameters with a retryable external
	// error, then succeeds.
	var flakes sync.Map
	set["flaky"] = func(_ context.Context, p json.RawMessage) (json.RawMessage, error) {
		n, _ := flakes.LoadOrStore(string(p), new(atomic.Int32))
		if n.(*atomic.Int32).Add(1) <= 2 {
			return nil, api.NewError(api.ExternalAPIError, "E3304", "upstream returned 503").AsRetryable()
		}
		return json.RawMessage(`{"ok":true}`), nil
	}
	// steps runs n steps of delay_ms each, checkpointing after each, and
	// resumes after the last checkpoint when restarted.
	set["steps"] = func(ctx context.Context, p json.RawMessage) (json.RawMessage, error) {
		var in struct {
			N       int `json:"n"`
			DelayMS int `json:"delay_ms"`
		}
		if err := json.Unmarshal(p, &in); err != nil {
			return nil, err
		}
		pr := kind.ProgressFrom(ctx)
		start := 0
		if r := pr.Resumed(); r != nil {
			var st struct {
				Next int `json:"next"`
			}
			if err := json.Unmarshal(r, &st); err != nil {
				return nil, err
			}
			start = st.Next
		}
		for i := start; i < in.N; i++ {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Duration(in.DelayMS) * time.Millisecond):
			}
			e.steps[i].Add(1)
			pr.Report(float64(i+1)*100/float64(in.N), fmt.Sprintf("step %d", i))
			if err := pr.Checkpoint(json.RawMessage(fmt.Sprintf(`{"next":%d}`, i+1))); err != nil {
				return nil, err
			}
			select {
			case e.stepped <- i:
			default:
			}
		}
		return json.RawMessage(fmt.Sprintf(`{"steps":%d,"started_at":%d}`, in.N, start)), nil
	}
	// block waits for the gate the first time it runs (a worker "stuck"
	// mid-flight), and returns at once on later runs.
	set["block"] = func(ctx context.Context, p json.RawMessage) (json.RawMessage, error) {
		if e.blocks.Add(1) == 1 {
			e.started <- string(p)
			select {
			case <-e.gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return json.RawMessage(`{}`), nil
	}
	set["hold"] = func(ctx context.Context, p json.RawMessage) (json.RawMessage, error) {
		n := e.holdingOf(string(p))
		e.holding.Add(1)
		n.Add(1)
		defer func() { e.holding.Add(-1); n.Add(-1) }()
		select {
		case <-e.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return json.RawMessage(`{}`), nil
	}
	return set
}

// holdingOf is the count of "hold" calls running with parameters p.
func (e *env) holdingOf(p string) *atomic.Int32 {
	n, _ := e.holdingBy.LoadOrStore(p, new(atomic.Int32))
	return n.(*atomic.Int32)
}

// testTools are manifests for the misbehaving builtins.
var testTools = []string{
	`{"id":"test.boom","name":"boom","version":"1.0.0","description":"panics","kind":"builtin","builtin":{"function":"boom"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"}}`,
	`{"id":"test.bad_output","name":"bad output","version":"1.0.0","description":"breaks its output schema","kind":"builtin",
	  "builtin":{"function":"bad_output"},"input_schema":{"type":"object"},
	  "output_schema":{"type":"object","required":["answer"],"properties":{"answer":{"type":"integer"}}}}`,
	`{"id":"test.block","name":"block","version":"1.0.0","description":"blocks once","kind":"builtin","builtin":{"function":"block"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},"limits":{"timeout_ms":60000}}`,
	`{"id":"test.hold","name":"hold","version":"1.0.0","description":"every call holds until released","kind":"builtin",
	  "builtin":{"function":"hold"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},"limits":{"timeout_ms":60000}}`,
	`{"id":"test.block_idem","name":"block (idempotent)","version":"1.0.0","description":"blocks once, safe to rerun","kind":"builtin",
	  "builtin":{"function":"block"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "limits":{"timeout_ms":60000},"safety":{"idempotent":true}}`,
	`{"id":"test.steps","name":"steps","version":"1.0.0","description":"checkpoints after each step","kind":"builtin",
	  "builtin":{"function":"steps"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},"limits":{"timeout_ms":60000}}`,
	`{"id":"test.removed","name":"removed","version":"1.0.0","description":"gone","kind":"builtin","builtin":{"function":"echo"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},"lifecycle":{"state":"removed"}}`,
	`{"id":"test.model","name":"model","version":"1.0.0","description":"no executor here","kind":"model",
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"}}`,
}

// startPipeline runs pipeline.Run against the env's server with the given
// stages (all when empty) until the test ends.
func (e *env) startPipeline(cfg node.Config) *node.Node {
	e.t.Helper()
	n, _ := e.runPipeline(cfg)
	return n
}

// runPipeline is startPipeline, also returning what stops the pipeline
// (and waits for it) before the test's end.
func (e *env) runPipeline(cfg node.Config) (*node.Node, func()) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg.NATSURL = e.url
	if cfg.Embedded.DataDir == "" {
		cfg.Embedded.DataDir = e.dataDir // holds the hop-sealing key
	}
	cfg.Examples = true
	cfg.Topology = e.topo
	if cfg.Workers == 0 {
		cfg.Workers = 2
	}
	if cfg.Log == nil {
		cfg.Log = quietLog()
	}
	if cfg.Stage.Builtins == nil {
		cfg.Stage.Builtins = e.builtins(e.t.TempDir())
	}
	if cfg.Stage.Tokens == nil {
		cfg.Stage.Tokens = testVerifier()
	}
	harnessDefaults(&cfg.Stage)
	nodes := make(chan *node.Node, 1)
	cfg.Ready = func(_ string, n *node.Node) { nodes <- n }
	errc := make(chan error, 1)
	go func() { errc <- node.Run(ctx, cfg) }()
	stop := sync.OnceFunc(func() {
		cancel()
		if err := <-errc; err != nil {
			e.t.Errorf("pipeline.Run: %v", err)
		}
	})
	e.t.Cleanup(stop)
	select {
	case n := <-nodes:
		for _, doc := range testTools {
			if _, err := n.Store.RegisterTool(ctx, []byte(doc), true); err != nil {
				e.t.Fatal(err)
			}
		}
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		for _, id := range []string{"test.boom", "test.bad_output", "test.block", "test.hold", "test.block_idem", "test.steps", "test.removed", "test.model"} {
			if err := n.WaitForTool(wctx, id, "1.0.0"); err != nil {
				e.t.Fatal(err)
			}
		}
		return n, stop
	case err := <-errc:
		e.t.Fatalf("pipeline did not start: %v", err)
	case <-time.After(60 * time.Second):
		e.t.Fatal("pipeline did not start in time")
	}
	return nil, stop
}

func request(tenant, tool string, params string) api.Request {
	return api.Request{ToolID: tool, Parameters: json.RawMessage(params),
		AgentContext:    api.AgentContext{AgentDID: "did:agent:test", TenantID: tenant},
		CapabilityToken: tokenFor(tenant, "did:agent:test")}
}

// Test capability tokens: one signing key for the package, and a token per
// tenant and agent granting every tool and the whole file root.
const (
	testIssuer   = "toolgate-test"
	testAudience = "toolgate"
)

var (
	testKey = sync.OnceValue(func() *token.SigningKey {
		k, err := token.GenerateSigningKey(token.AlgEdDSA)
		if err != nil {
			panic(err)
		}
		return k
	})
	testTokens sync.Map
)

func testVerifier() *token.Verifier {
	return &token.Verifier{Keys: token.StaticKeys{Set: testKey().KeySet()}, Issuer: testIssuer, Audience: testAudience}
}

// mint signs c with the test key, filling in issuer, audience and expiry.
func mint(t testing.TB, c token.Claims) string {
	t.Helper()
	c.Issuer, c.Audience = testIssuer, jwt.ClaimStrings{testAudience}
	if c.ExpiresAt == nil {
		c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(time.Hour))
	}
	raw, err := token.Mint(testKey(), c)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func tokenFor(tenant, agent string) string {
	key := tenant + "|" + agent
	if raw, ok := testTokens.Load(key); ok {
		return raw.(string)
	}
	raw, err := token.Mint(testKey(), token.Claims{
		ToolID: token.Patterns{"*"}, TenantID: tenant, AgentDID: agent,
		Filesystem: &token.FilesystemGrant{AllowedPaths: []string{"/"}, Mode: "rw"},
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer: testIssuer, Audience: jwt.ClaimStrings{testAudience},
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour)),
		},
	})
	if err != nil {
		// A tenant no token may name (ingest refuses it before any token
		// is read): the request carries none.
		return ""
	}
	testTokens.Store(key, raw)
	return raw
}

// withToken adds a capability token for tenant and agent to a hand-written
// ToolInvokeRequest (or a structured CloudEvent holding one).
func withToken(body, tenant, agent string) string {
	return strings.Replace(body, `"agent_context":`, `"capability_token":"`+tokenFor(tenant, agent)+`","agent_context":`, 1)
}

// invoke sends req and waits for its response.
func (e *env) invoke(req api.Request) api.Response {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := e.client.Invoke(ctx, req, client.InvokeOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	resp, err := e.client.Wait(ctx, req.AgentContext.TenantID, id)
	if err != nil {
		e.t.Fatalf("waiting for %s: %v", id, err)
	}
	return resp
}

// publishRaw publishes a hand-built NATS message, the way the nats CLI does,
// and returns the first result of tenant that follows.
func (e *env) publishRaw(subject string, header nats.Header, body []byte) api.Response {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: header, Data: body}); err != nil {
		e.t.Fatal(err)
	}
	tenant := strings.TrimPrefix(subject, "tool.invoke.")
	msgs := e.read(subjects.StreamResults, subjects.ResultTenant(tenant), 1, 30*time.Second)
	resp, err := client.DecodeResult(msgs[0].Data())
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

// read returns the first n messages of stream matching filter, waiting up to
// d for them to arrive.
func (e *env) read(stream, filter string, n int, d time.Duration) []jetstream.Msg {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cons, err := e.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []jetstream.Msg
	for len(out) < n {
		m, err := cons.Next(jetstream.FetchMaxWait(time.Until(deadline(ctx))))
		if err != nil {
			e.t.Fatalf("reading %s %s: got %d of %d messages: %v", stream, filter, len(out), n, err)
		}
		out = append(out, m)
	}
	return out
}

func deadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// count returns how many messages stream holds on filter.
//
// A stage publishes an invocation's audit event and its result together, so
// a caller that has the result may look before the event is stored: count
// answers once the number has held for a few reads.
func (e *env) count(stream, filter string) int {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := e.js.Stream(ctx, stream)
	if err != nil {
		e.t.Fatal(err)
	}
	read := func() int {
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
		if err != nil {
			e.t.Fatal(err)
		}
		var n uint64
		for _, c := range info.State.Subjects {
			n += c
		}
		return int(n)
	}
	n, same := read(), 0
	for same < 3 && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
		if m := read(); m == n {
			same++
		} else {
			n, same = m, 0
		}
	}
	return n
}

// auditOf returns the CloudEvents on audit.<tenant>.> with their subjects.
func (e *env) auditOf(tenant string, n int) []event.Event {
	e.t.Helper()
	var out []event.Event
	for _, m := range e.read(subjects.StreamAudit, subjects.AuditTenant(tenant), n, 30*time.Second) {
		var ev event.Event
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			e.t.Fatalf("audit message is not a CloudEvent: %v: %s", err, m.Data())
		}
		out = append(out, ev)
	}
	return out
}

// eventually polls cond until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	natstest.Eventually(t, d, cond, what)
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type clientInvokeOptions = client.InvokeOptions

// consumerInfo reads the state of a stage's durable consumer.
func (e *env) consumerInfo(stage string) (*jetstream.ConsumerInfo, error) {
	return e.consumerInfoOf(subjects.InputOf(stage))
}

// consumerInfoOf reads the state of one durable consumer.
func (e *env) consumerInfoOf(in subjects.Input) (*jetstream.ConsumerInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := e.js.Consumer(ctx, in.Stream, in.Consumer)
	if err != nil {
		return nil, err
	}
	return cons.Info(ctx)
}
