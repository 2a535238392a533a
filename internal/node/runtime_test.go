package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/stages/execute/builtin"
	"github.com/toolgate/toolgate/stages/execute/mcptool"
	"github.com/toolgate/toolgate/stages/execute/mcptool/mcptest"
	"github.com/toolgate/toolgate/subjects"
)

// runPipeline runs pipeline.Run with cfg and returns the node and NATS URL
// once it is ready, and stop, which ends the run and returns Run's error
// (the test's end stops it too).
func runPipeline(t *testing.T, cfg node.Config) (n *node.Node, url string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if cfg.Log == nil {
		cfg.Log = quietLog()
	}
	type ready struct {
		n   *node.Node
		url string
	}
	readyc := make(chan ready, 1)
	cfg.Ready = func(url string, n *node.Node) { readyc <- ready{n, url} }
	errc := make(chan error, 1)
	go func() { errc <- node.Run(ctx, cfg) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-errc:
			case <-time.After(90 * time.Second):
				runErr = errors.New("pipeline.Run did not return after its context ended")
			}
		})
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("pipeline.Run: %v", err)
		}
	})
	select {
	case r := <-readyc:
		return r.n, r.url, stop
	case err := <-errc:
		errc <- err
		t.Fatalf("pipeline did not start: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("pipeline did not start in time")
	}
	return nil, "", stop
}

// TestMakeRunLayout runs what make run runs, with its relative paths: the
// embedded server's data in ./toolgate-data and the file root
// ./examples/files. File tools and cli tools read the file root; nothing
// reaches the development signing key; and a file root holding the data
// directory is refused at start.
func TestMakeRunLayout(t *testing.T) {
	if err := sandbox.Available(); err != nil {
		t.Fatalf("this test needs bubblewrap and prlimit: %v", err)
	}
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		_ = os.Chmod(d, 0o755)
	}
	t.Chdir(dir)
	if err := os.MkdirAll("examples/files", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("examples/files/README.md", []byte("example file"), 0o644); err != nil {
		t.Fatal(err)
	}

	t.Run("file root holding the data directory is refused", func(t *testing.T) {
		for _, root := range []string{".", "toolgate-data/files"} {
			// A refusal returns at once; a start would run until the deadline.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := node.Run(ctx, node.Config{Examples: true, Log: quietLog(),
				Embedded: node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: "toolgate-data"},
				Stage:    node.StageConfig{BuiltinEnv: builtinEnv(root)}})
			var te *api.Error
			if !errors.As(err, &te) || te.ECode != api.EUnsafeFileRoot || !strings.Contains(te.Message, "toolgate-data") {
				t.Fatalf("file root %s: got %v, want E3950 naming the data directory", root, err)
			}
		}
	})

	n, url, _ := runPipeline(t, node.Config{Examples: true, Workers: 1,
		Embedded: node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: "toolgate-data"},
		Stage:    node.StageConfig{BuiltinEnv: builtinEnv("examples/files")}})
	if _, err := os.Stat("toolgate-data/dev-signing-key.jwk"); err != nil {
		t.Fatalf("development key: %v", err)
	}
	// The embedded bus admits no one without credentials.
	if anon, err := nats.Connect(url); err == nil {
		anon.Close()
		t.Fatal("serve's embedded server admitted an anonymous client")
	}
	nc, err := nats.Connect(url, busauth.CredentialsOption(node.CredsPath("toolgate-data", busauth.RoleOperator)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Tools are registered by an operator, with a signed request: the
	// stages honour only manifests an operator signed.
	sg, err := busauth.SignerFromCreds(node.CredsPath("toolgate-data", busauth.RoleOperator))
	if err != nil {
		t.Fatal(err)
	}
	c.Sign = func(subject string, body []byte) (nats.Header, error) { return sg.Sign(nil, subject, body, time.Now()) }
	if _, err := c.RegisterTool(ctx, []byte(cliTool("test.cat", `x=$(cat "/files/$1") && printf '{"text":"%s"}' "$x"`, "",
		`{"filesystem":[{"path":"/","mode":"ro"}]}`)), true); err != nil {
		t.Fatal(err)
	}
	if err := n.WaitForTool(ctx, "test.cat", "1.0.0"); err != nil {
		t.Fatal(err)
	}
	call := func(tool, params string) api.Response {
		t.Helper()
		req := api.Request{ToolID: tool, Parameters: json.RawMessage(params), CapabilityToken: n.DevToken,
			AgentContext: api.AgentContext{AgentDID: node.DevAgent, TenantID: node.DevTenant}}
		id, err := c.Invoke(ctx, req, client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Wait(ctx, node.DevTenant, id)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if r := call("fs.read_file", `{"path":"README.md"}`); r.Status != api.StatusSuccess || !strings.Contains(string(r.Result), "example file") {
		t.Fatalf("fs.read_file README.md: %s %s %s", r.Status, r.Result, mustJSON(t, r.Error))
	}
	if r := call("test.cat", `{"arg":"README.md"}`); r.Status != api.StatusSuccess || !strings.Contains(string(r.Result), "example file") {
		t.Fatalf("cli tool under a relative file root: %s %s %s", r.Status, r.Result, mustJSON(t, r.Error))
	}
	for _, p := range []string{"../../toolgate-data/dev-signing-key.jwk", "toolgate-data/dev-signing-key.jwk"} {
		if r := call("fs.read_file", `{"path":"`+p+`"}`); r.Status == api.StatusSuccess {
			t.Fatalf("fs.read_file %s reached the signing key: %s", p, r.Result)
		}
		if r := call("test.cat", `{"arg":"`+p+`"}`); r.Status == api.StatusSuccess {
			t.Fatalf("cli tool %s reached the signing key: %s", p, r.Result)
		}
	}
	if r := call("fs.list_dir", `{}`); r.Status != api.StatusSuccess || strings.Contains(string(r.Result), "toolgate-data") {
		t.Fatalf("fs.list_dir of the root: %s %s", r.Status, r.Result)
	}
}

func builtinEnv(root string) builtin.Env { return builtin.Env{FileRoot: root} }

// TestStageControlStays: `toolgate stage control` runs only the control
// service, which has no runner to wait for; it must serve until its context
// ends, then return.
func TestStageControlStays(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	_, _, stop := runPipeline(t, node.Config{NATSURL: e.url, Stages: []string{node.Control}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Long enough for a Run that returns at once to have stopped the service.
	time.Sleep(300 * time.Millisecond)
	if _, err := e.client.ListTools(ctx, api.ListRequest{}); err != nil {
		t.Fatalf("the control service is gone: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestDrainFinishesMCPCall: a worker told to stop while an MCP call is in
// flight finishes the call (its server stays up until the drain is over) and
// hands the result on; the rest of the pipeline, in another process,
// completes the invocation successfully.
func TestDrainFinishesMCPCall(t *testing.T) {
	if err := sandbox.Available(); err != nil {
		t.Fatalf("this test needs bubblewrap and prlimit: %v", err)
	}
	script, modules := mcptest.Everything(t)
	e := newEnv(t, topology.TopologyOptions{})
	others := []string{subjects.Validate, subjects.Authorize, subjects.Route, subjects.Verify, subjects.Audit, node.Control}
	n, _, _ := runPipeline(t, node.Config{NATSURL: e.url, Stages: others, Workers: 1,
		Stage: node.StageConfig{Tokens: testVerifier()}})
	_, _, stopExecute := runPipeline(t, node.Config{NATSURL: e.url, Stages: []string{subjects.Execute}, Workers: 1,
		Stage: node.StageConfig{Sandbox: sandbox.Config{FileRoot: t.TempDir(), ReadOnlyRoots: mcptest.Roots(t)}}})
	spec := mcptool.Spec{Server: "everything", Tool: "trigger-long-running-operation", Command: []string{"node", script, "stdio"},
		ReadOnlyPaths: []string{modules}}
	registerTools(t, n, mcpManifest(t, "mcp:everything:long", spec, `,"limits":{"timeout_ms":60000}`))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req := request("drain", "mcp:everything:long", `{"duration":3,"steps":3}`)
	id, err := e.client.Invoke(ctx, req, client.InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		rec, err := e.client.Status(ctx, "drain", id)
		if err == nil && rec.Status == api.StatusRunning {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the call never ran: %v %v", rec.Status, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := stopExecute(); err != nil {
		t.Fatalf("execute worker: %v", err)
	}
	resp, err := e.client.Wait(ctx, "drain", id)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != api.StatusSuccess || !strings.Contains(string(resp.Result), "Long running operation completed") {
		t.Fatalf("drained call: %s %s %s", resp.Status, resp.Result, mustJSON(t, resp.Error))
	}
}

// TestWorkersWaitForServer: stage workers started before their NATS server
// (and so before any stream, consumer or bucket exists) wait, retrying with
// backoff, and come up once the server does; a call then runs through them.
func TestWorkersWaitForServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	url := "nats://" + addr
	type started struct {
		n    *node.Node
		stop func() error
	}
	ready := make(chan started, 2)
	for _, names := range [][]string{{subjects.Validate, subjects.Authorize, subjects.Route, node.Control},
		{subjects.Execute, subjects.Verify, subjects.Audit}} {
		go func() {
			n, _, stop := runPipeline(t, node.Config{NATSURL: url, Stages: names, Workers: 1,
				Stage: node.StageConfig{Tokens: testVerifier(), Builtins: builtin.New(builtin.Env{})}})
			ready <- started{n, stop}
		}()
	}
	select {
	case <-ready:
		t.Fatal("a worker came up without a server")
	case <-time.After(time.Second): // the workers are retrying by now
	}
	ns, err := node.StartEmbedded(node.EmbeddedOptions{Listen: addr, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var all []started
	// The workers stop before their server does.
	t.Cleanup(func() {
		for _, s := range all {
			_ = s.stop()
		}
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	for range 2 {
		select {
		case s := <-ready:
			all = append(all, s)
		case <-time.After(60 * time.Second):
			t.Fatal("workers did not come up after the server did")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := all[0].n.RegisterExamples(ctx); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	req := request("late", "echo", `{"message":"late server"}`)
	req.ToolVersion = "2.0.0"
	id, err := c.Invoke(ctx, req, client.InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Wait(ctx, "late", id)
	if err != nil || resp.Status != api.StatusSuccess {
		t.Fatalf("call through late workers: %v %s %s", err, resp.Status, mustJSON(t, resp.Error))
	}
}

// TestSecuritySettingsAgree: a second worker whose security settings differ
// from the ones the cluster recorded is refused with E3951 naming the
// setting (no key set beside one with a key set; --sandbox none beside
// bwrap); one with the same settings joins; and an operator's reset replaces
// the record.
func TestSecuritySettingsAgree(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	root := t.TempDir()
	good := node.Config{NATSURL: e.url, Stages: []string{subjects.Authorize, subjects.Execute}, Workers: 1,
		Stage: node.StageConfig{Tokens: testVerifier(), Sandbox: sandbox.Config{FileRoot: root}}}
	runPipeline(t, good)
	start := func(cfg node.Config) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cfg.Log = quietLog()
		cfg.Ready = func(string, *node.Node) { cancel() } // started: stop at once
		return node.Run(ctx, cfg)
	}
	for _, c := range []struct {
		setting string
		change  func(*node.Config)
	}{
		{"key set", func(c *node.Config) { c.Stage.Tokens = nil }},
		{"sandbox", func(c *node.Config) { c.Stage.Sandbox.Mode = sandbox.ModeNone }},
		{"file root", func(c *node.Config) { c.Stage.Sandbox.FileRoot = t.TempDir() }},
		{"http private networks", func(c *node.Config) { c.Stage.HTTPAllowPrivateNetworks = true }},
	} {
		t.Run(c.setting, func(t *testing.T) {
			cfg := good
			c.change(&cfg)
			err := start(cfg)
			var te *api.Error
			if !errors.As(err, &te) || te.ECode != api.ESecuritySettings || te.Details["setting"] != c.setting {
				t.Fatalf("got %v, want E3951 naming %q", err, c.setting)
			}
		})
	}
	if err := start(good); err != nil {
		t.Fatalf("a worker with the same settings: %v", err)
	}
	// The same keys from a JWKS file (toolgate stage --jwks) agree with the
	// keys held in memory; another key set does not.
	jwks := func(k *token.SigningKey) string {
		b, err := k.PublicJWKS()
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), "jwks.json")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fromFile := good
	fromFile.Stage.Tokens, fromFile.JWKSPath = nil, jwks(testKey())
	fromFile.TokenIssuer, fromFile.TokenAudience = testIssuer, testAudience
	if err := start(fromFile); err != nil {
		t.Fatalf("the same keys from a JWKS file: %v", err)
	}
	other, err := token.GenerateSigningKey(token.AlgEdDSA)
	if err != nil {
		t.Fatal(err)
	}
	fromFile.JWKSPath = jwks(other)
	var te *api.Error
	if err := start(fromFile); !errors.As(err, &te) || te.Details["setting"] != "key set" {
		t.Fatalf("another key set from a file: got %v, want E3951 naming the key set", err)
	}
	// A worker running validate only has no security setting to disagree on.
	if err := start(node.Config{NATSURL: e.url, Stages: []string{subjects.Validate}}); err != nil {
		t.Fatalf("a validate worker: %v", err)
	}
	changed := good
	changed.Stage.HTTPAllowPrivateNetworks = true
	changed.ResetSecuritySettings = true
	if err := start(changed); err != nil {
		t.Fatalf("reset: %v", err)
	}
	changed.ResetSecuritySettings = false
	if err := start(changed); err != nil {
		t.Fatalf("after the reset: %v", err)
	}
	if err := start(good); err == nil {
		t.Fatal("the old settings were accepted after the reset")
	}
}
