package mcptool_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages/execute/kind"
	"github.com/toolgate/toolgate/stages/execute/mcptool"
	"github.com/toolgate/toolgate/stages/execute/mcptool/mcptest"
)

func requireSandbox(t *testing.T) {
	t.Helper()
	if err := sandbox.Available(); err != nil {
		t.Fatalf("these tests need bubblewrap and prlimit (.ci/run installs them): %v", err)
	}
}

// manifest parses a manifest of kind mcp for tool with the given mcp
// object; extra is spliced into the top level.
func manifest(t *testing.T, tool string, spec any, extra string) *tools.Manifest {
	t.Helper()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	doc := fmt.Sprintf(`{"id":"mcp:test:%s","name":"%s","version":"1.0.0","description":"test","kind":"mcp",
		"mcp":%s,"input_schema":{"type":"object"}%s}`, strings.ToLower(tool), tool, raw, extra)
	m, err := tools.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	return m
}

func flakySpec(bin string, tool string, args ...string) mcptool.Spec {
	return mcptool.Spec{Server: "flaky", Tool: tool, Command: append([]string{bin}, args...),
		ReadOnlyPaths: []string{filepath.Dir(bin)}}
}

func newKind(t *testing.T, cfg mcptool.Config) *mcptool.Kind {
	t.Helper()
	requireSandbox(t)
	if len(cfg.Sandbox.ReadOnlyRoots) == 0 {
		cfg.Sandbox.ReadOnlyRoots = mcptest.Roots(t)
	}
	k := mcptool.New(cfg)
	t.Cleanup(func() { _ = k.Close() })
	return k
}

func prepare(t *testing.T, k *mcptool.Kind, m *tools.Manifest, grants envelope.Grants) kind.Func {
	t.Helper()
	fn, err := k.Prepare(m, &envelope.Invocation{Tenant: "t1", Authz: &envelope.Authorization{Grants: grants}})
	if err != nil {
		t.Fatal(err)
	}
	return fn
}

func call(t *testing.T, fn kind.Func, params string) (json.RawMessage, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return fn(ctx, json.RawMessage(params))
}

func wantECode(t *testing.T, err error, code string) *api.Error {
	t.Helper()
	var te *api.Error
	if !errors.As(err, &te) || te.ECode != code {
		t.Fatalf("got %v, want %s", err, code)
	}
	return te
}

func TestEverythingEcho(t *testing.T) {
	script, modules := mcptest.Everything(t)
	k := newKind(t, mcptool.Config{})
	m := manifest(t, "echo", mcptool.Spec{Server: "everything", Tool: "echo", Command: []string{"node", script, "stdio"},
		ReadOnlyPaths: []string{modules}}, "")
	out, err := call(t, prepare(t, k, m, envelope.Grants{}), `{"message":"hello from toolgate"}`)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Content []struct{ Type, Text string }
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Content) != 1 || !strings.Contains(res.Content[0].Text, "hello from toolgate") {
		t.Fatalf("echo result %s (%v)", out, err)
	}
}

// TestCrashAndRestart: a server exiting mid-call ends that call with E3121;
// while it waits out its backoff, calls get a retryable E3120 that says
// nothing ran; then it is back, as a new process.
func TestCrashAndRestart(t *testing.T) {
	bin := mcptest.Flaky(t)
	k := newKind(t, mcptool.Config{Backoff: mcptool.Backoff{Min: 700 * time.Millisecond, Max: 5 * time.Second}})
	whoami := prepare(t, k, manifest(t, "whoami", flakySpec(bin, "whoami"), ""), envelope.Grants{})
	crash := prepare(t, k, manifest(t, "crash", flakySpec(bin, "crash"), ""), envelope.Grants{})
	instance := func() int64 {
		t.Helper()
		out, err := call(t, whoami, `{}`)
		if err != nil {
			t.Fatal(err)
		}
		var who struct{ Instance, UID int64 }
		if err := json.Unmarshal(out, &who); err != nil {
			t.Fatal(err)
		}
		if os.Geteuid() == 0 && who.UID < sandbox.UIDBase {
			t.Fatalf("the server runs as uid %d, want one of its own from %d up", who.UID, sandbox.UIDBase)
		}
		return who.Instance
	}
	first := instance()
	if again := instance(); again != first {
		t.Fatalf("the server was not kept warm: instance %d then %d", first, again)
	}
	_, err := call(t, crash, `{}`)
	te := wantECode(t, err, api.EMCPServerExited)
	if !strings.Contains(te.Message, "crashing as asked") {
		t.Fatalf("the crash error does not carry the server's last words: %s", te.Message)
	}
	_, err = call(t, whoami, `{}`)
	te = wantECode(t, err, api.EMCPServerDown)
	if !te.Retryable || te.Details["not_started"] != true {
		t.Fatalf("a call while the server is down must be retryable and not started: %+v", te)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := call(t, whoami, `{}`)
		if err == nil {
			var who struct{ Instance int64 }
			_ = json.Unmarshal(out, &who)
			if who.Instance == first {
				t.Fatal("the crashed process answered")
			}
			break
		}
		wantECode(t, err, api.EMCPServerDown)
		if time.Now().After(deadline) {
			t.Fatalf("the server did not come back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBackoffGrows: a server that dies at every start is started again
// with doubling delays, not in a tight loop.
func TestBackoffGrows(t *testing.T) {
	bin := mcptest.Flaky(t)
	logDir := mcptest.Shared(t, t.TempDir())
	if err := os.Chmod(logDir, 0o777); err != nil {
		t.Fatal(err)
	}
	startLog := filepath.Join(logDir, "starts")
	// Each start runs under a uid of its own: the log must be writable by all.
	if err := os.WriteFile(startLog, nil, 0o666); err != nil || os.Chmod(startLog, 0o666) != nil {
		t.Fatal(err)
	}
	// The server writes its start log into a directory granted read-write
	// under the file root, as a deployment would grant it.
	k := newKind(t, mcptool.Config{Sandbox: sandbox.Config{FileRoot: filepath.Dir(logDir)},
		Backoff: mcptool.Backoff{Min: 100 * time.Millisecond, Max: 800 * time.Millisecond}})
	spec := flakySpec(bin, "whoami", "-die-at-start", "-start-log", "/files/"+filepath.Base(logDir)+"/starts")
	m := manifest(t, "whoami", spec, `,"permissions":{"filesystem":[{"path":"`+filepath.Base(logDir)+`","mode":"rw"}]}`)
	fn := prepare(t, k, m, envelope.Grants{PathMode: "rw"})
	_, err := call(t, fn, `{}`)
	te := wantECode(t, err, api.EMCPServerDown)
	if te.Details["not_started"] != true || !strings.Contains(te.Message, "dying at start") {
		t.Fatalf("first failure: %+v", te)
	}
	time.Sleep(3 * time.Second)
	_, err = call(t, fn, `{}`)
	wantECode(t, err, api.EMCPServerDown)
	b, err := os.ReadFile(startLog)
	if err != nil {
		t.Fatal(err)
	}
	var starts []int64
	for _, l := range strings.Fields(string(b)) {
		n, _ := strconv.ParseInt(l, 10, 64)
		starts = append(starts, n)
	}
	// Delays of 100, 200, 400, 800, 800 ms plus each start's own time: a
	// handful of starts in 3 s, where a tight loop would make hundreds, and
	// the later gaps at least twice the first.
	if len(starts) < 3 || len(starts) > 8 {
		t.Fatalf("%d starts in 3 s: %v", len(starts), starts)
	}
	first, last := starts[1]-starts[0], starts[len(starts)-1]-starts[len(starts)-2]
	if last < 2*first {
		t.Fatalf("start gaps do not grow: %v", starts)
	}
}

// TestConcurrencyLimit: no more than max_concurrency calls reach a server
// at once, however many arrive.
func TestConcurrencyLimit(t *testing.T) {
	bin := mcptest.Flaky(t)
	k := newKind(t, mcptool.Config{})
	spec := flakySpec(bin, "slow")
	spec.MaxConcurrency = 2
	fn := prepare(t, k, manifest(t, "slow", spec, ""), envelope.Grants{})
	if _, err := call(t, fn, `{"ms":1}`); err != nil { // started, so timing below is calls only
		t.Fatal(err)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	most := make(chan int, 8)
	for range 8 {
		wg.Go(func() {
			out, err := call(t, fn, `{"ms":200}`)
			if err != nil {
				errs <- err
				return
			}
			var r struct {
				MostAtOnce int `json:"most_at_once"`
			}
			_ = json.Unmarshal(out, &r)
			most <- r.MostAtOnce
		})
	}
	wg.Wait()
	close(errs)
	close(most)
	for err := range errs {
		t.Fatal(err)
	}
	for n := range most {
		if n > 2 {
			t.Fatalf("the server saw %d calls at once, limit 2", n)
		}
	}
	if d := time.Since(start); d < 800*time.Millisecond {
		t.Fatalf("8 calls of 200 ms two at a time took %v", d)
	}
}

// TestHangAndToolError: a call that never returns ends with its context and
// leaves the server serving; isError is a tool error carrying the text.
func TestHangAndToolError(t *testing.T) {
	bin := mcptest.Flaky(t)
	k := newKind(t, mcptool.Config{})
	hang := prepare(t, k, manifest(t, "hang", flakySpec(bin, "hang"), ""), envelope.Grants{})
	echo := prepare(t, k, manifest(t, "echo", flakySpec(bin, "echo"), ""), envelope.Grants{})
	fail := prepare(t, k, manifest(t, "fail", flakySpec(bin, "fail"), ""), envelope.Grants{})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := hang(ctx, json.RawMessage(`{}`)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hang: %v", err)
	}
	out, err := call(t, echo, `{"text":"still here"}`)
	if err != nil || !strings.Contains(string(out), "still here") {
		t.Fatalf("after a hang: %s %v", out, err)
	}
	_, err = call(t, fail, `{}`)
	te := wantECode(t, err, api.EToolFailed)
	if te.Code != api.ToolExecutionError || !strings.Contains(te.Message, "the disk is on fire") {
		t.Fatalf("isError: %+v", te)
	}
	// An unknown tool is the server's refusal, not a crash.
	unknown := prepare(t, k, manifest(t, "nope", flakySpec(bin, "nope"), ""), envelope.Grants{})
	_, err = call(t, unknown, `{}`)
	if te := api.AsError(err); te.ECode != api.EMCPProtocol && te.ECode != api.EToolFailed {
		t.Fatalf("unknown tool: %v", err)
	}
}

// TestCloseEndsServers: Close leaves no server process behind and refuses
// later calls.
func TestCloseEndsServers(t *testing.T) {
	bin := mcptest.Flaky(t)
	k := mcptool.New(mcptool.Config{Sandbox: sandbox.Config{ReadOnlyRoots: mcptest.Roots(t)}})
	requireSandbox(t)
	fn := prepare(t, k, manifest(t, "whoami", flakySpec(bin, "whoami"), ""), envelope.Grants{})
	if _, err := call(t, fn, `{}`); err != nil {
		t.Fatal(err)
	}
	if len(processesWith(bin)) == 0 {
		t.Fatal("no server process found")
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if left := processesWith(bin); len(left) > 0 {
		t.Fatalf("processes left after Close: %v", left)
	}
	_, err := k.Prepare(manifest(t, "whoami", flakySpec(bin, "whoami"), ""), &envelope.Invocation{Tenant: "t1"})
	wantECode(t, err, api.EMCPServerDown)
}

func processesWith(marker string) []string {
	var out []string
	files, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), marker) {
			out = append(out, f+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

// TestStreamableHTTP: a server at a URL is reached when the manifest
// declares its host and the token grants it, and refused otherwise.
func TestStreamableHTTP(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "remote", Version: "1.0.0"}, nil)
	type in struct {
		A, B int
	}
	type out struct {
		Sum int `json:"sum"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "add", Description: "adds"}, func(_ context.Context, _ *mcp.CallToolRequest, a in) (*mcp.CallToolResult, out, error) {
		return nil, out{Sum: a.A + a.B}, nil
	})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	defer srv.Close()
	k := mcptool.New(mcptool.Config{})
	t.Cleanup(func() { _ = k.Close() })
	spec := mcptool.Spec{Server: "remote", Tool: "add", URL: srv.URL + "/mcp"}
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	m := manifest(t, "add", spec, fmt.Sprintf(`,"permissions":{"network":[{"host":"127.0.0.1","port":%d}]}`, port))
	fn := prepare(t, k, m, envelope.Grants{Hosts: []string{"127.0.0.1"}})
	res, err := call(t, fn, `{"A":2,"B":40}`)
	if err != nil || string(res) != `{"sum":42}` {
		t.Fatalf("add: %s %v", res, err)
	}
	// Not granted by the token.
	_, err = k.Prepare(m, &envelope.Invocation{Tenant: "t1", Authz: &envelope.Authorization{}})
	wantECode(t, err, api.ENetworkDenied)
	// Not declared by the manifest.
	other := manifest(t, "add", spec, `,"permissions":{"network":[{"host":"example.com"}]}`)
	_, err = k.Prepare(other, &envelope.Invocation{Tenant: "t1", Authz: &envelope.Authorization{Grants: envelope.Grants{Hosts: []string{"*"}}}})
	wantECode(t, err, api.ENetworkDenied)
}

// TestImportManifests: every tool of a server becomes a manifest with id
// mcp:<server>:<tool>, the operator's risk and side effects, and the
// server's annotations recorded but not believed.
func TestImportManifests(t *testing.T) {
	script, modules := mcptest.Everything(t)
	bin := mcptest.Flaky(t)
	k := newKind(t, mcptool.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	docs, err := k.Manifests(ctx, mcptool.Import{Server: "everything", Command: []string{"node", script, "stdio"},
		ReadOnlyPaths: []string{modules}})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]*tools.Manifest{}
	for _, d := range docs {
		m, err := tools.Parse(d)
		if err != nil {
			t.Fatalf("%v\n%s", err, d)
		}
		ids[m.ID] = m
	}
	t.Logf("server-everything tools: %v", slices.Sorted(maps.Keys(ids)))
	echo, ok := ids["mcp:everything:echo"]
	if !ok || echo.Safety.RiskLevel != mcptool.DefaultImportRisk {
		t.Fatalf("echo: %+v", echo)
	}

	docs, err = k.Manifests(ctx, mcptool.Import{Server: "flaky", Command: []string{bin}, ReadOnlyPaths: []string{filepath.Dir(bin)},
		Risk: "medium", SideEffects: []string{"fs.delete"}, Version: "2.1.0"})
	if err != nil {
		t.Fatal(err)
	}
	var wipe *tools.Manifest
	for _, d := range docs {
		m, err := tools.Parse(d)
		if err != nil {
			t.Fatal(err)
		}
		if m.ID == "mcp:flaky:wipe_everything" {
			wipe = m
		}
	}
	if wipe == nil {
		t.Fatal("no mcp:flaky:wipe_everything")
	}
	// The server calls it a read-only, idempotent, non-destructive lookup.
	if wipe.Safety.RiskLevel != "medium" || !slices.Equal(wipe.Safety.SideEffects, []string{"fs.delete"}) ||
		wipe.Safety.Idempotent || wipe.Version != "2.1.0" {
		t.Fatalf("operator's safety not applied: %+v", wipe.Safety)
	}
	spec, err := mcptool.Decode(wipe)
	if err != nil {
		t.Fatal(err)
	}
	if spec.Tool != "wipeEverything" || !strings.Contains(string(spec.ServerAnnotations), `"readOnlyHint":true`) {
		t.Fatalf("spec %+v annotations %s", spec, spec.ServerAnnotations)
	}
}

func TestToolID(t *testing.T) {
	for in, want := range map[string]string{
		"echo": "mcp:s:echo", "getSum": "mcp:s:get_sum", "get-tiny-image": "mcp:s:get-tiny-image",
		"read_file": "mcp:s:read_file", "HTTPGet": "mcp:s:httpget", "a b/c": "mcp:s:a_b_c",
	} {
		if got := mcptool.ToolID("s", in); got != want {
			t.Errorf("ToolID(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestServersPerTenantAndDefinition: each tenant gets a server process of
// its own, so state one tenant leaves in a server (server-everything's
// simulated-logging toggle lives in the process) is not seen by another; and
// a changed definition reaches a new process, not the old one.
func TestServersPerTenantAndDefinition(t *testing.T) {
	script, modules := mcptest.Everything(t)
	k := newKind(t, mcptool.Config{})
	spec := mcptool.Spec{Server: "everything", Tool: "toggle-simulated-logging", Command: []string{"node", script, "stdio"},
		ReadOnlyPaths: []string{modules}}
	toggle := manifest(t, "toggle-simulated-logging", spec, "")
	text := func(tenant string, m *tools.Manifest, params string) string {
		t.Helper()
		fn, err := k.Prepare(m, &envelope.Invocation{Tenant: tenant})
		if err != nil {
			t.Fatal(err)
		}
		out, err := call(t, fn, params)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	if got := text("acme", toggle, `{}`); !strings.Contains(got, "Started") {
		t.Fatalf("acme's first toggle: %s", got)
	}
	if got := text("globex", toggle, `{}`); !strings.Contains(got, "Started") {
		t.Fatalf("globex saw acme's server state: %s", got)
	}
	if got := text("acme", toggle, `{}`); !strings.Contains(got, "Stopped") {
		t.Fatalf("acme's second toggle reached another process: %s", got)
	}

	spec.Tool = "get-env"
	for _, v := range []string{"one", "two"} {
		spec.Env = map[string]string{"TOOLGATE_DEF": "version-" + v}
		if got := text("acme", manifest(t, "get-env", spec, ""), `{}`); !strings.Contains(got, "version-"+v) {
			t.Fatalf("definition %s answered by another process: %s", v, got)
		}
	}
}

// TestReadOnlyPathsConfined: a server's read_only_paths must lie, once
// resolved, under a directory the operator allows for servers; a symlink
// under an allowed directory leading elsewhere, or to a host interface such
// as /proc, is refused before any process starts.
func TestReadOnlyPathsConfined(t *testing.T) {
	bin := mcptest.Flaky(t)
	allowed := filepath.Dir(bin)
	outside := mcptest.Shared(t, t.TempDir())
	for link, target := range map[string]string{"to_outside": outside, "to_proc": "/proc/self", "to_etc": "/etc"} {
		if err := os.Symlink(target, filepath.Join(allowed, link)); err != nil {
			t.Fatal(err)
		}
	}
	k := newKind(t, mcptool.Config{Sandbox: sandbox.Config{ReadOnlyRoots: []string{allowed}}})
	for _, p := range []string{filepath.Join(allowed, "to_outside"), filepath.Join(allowed, "to_proc"),
		filepath.Join(allowed, "to_etc"), outside, "/etc"} {
		t.Run(p, func(t *testing.T) {
			spec := flakySpec(bin, "whoami")
			spec.ReadOnlyPaths = append(spec.ReadOnlyPaths, p)
			_, err := k.Prepare(manifest(t, "whoami", spec, ""), &envelope.Invocation{Tenant: "t1"})
			te := wantECode(t, err, api.EPathOutsideRoots)
			if te.Details["not_started"] != true {
				t.Fatalf("details %v", te.Details)
			}
		})
	}
	// The server's own install, under the allowed directory, still runs.
	fn := prepare(t, k, manifest(t, "whoami", flakySpec(bin, "whoami"), ""), envelope.Grants{})
	if _, err := call(t, fn, `{}`); err != nil {
		t.Fatal(err)
	}
}
