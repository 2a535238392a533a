package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/pflag"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// syncBuffer is a bytes.Buffer safe to read while a command writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type result struct {
	stdout, stderr string
	code           int
}

// tg runs the command line in-process.
func tg(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	var out, errb syncBuffer
	code := run(t.Context(), args, strings.NewReader(stdin), &out, &errb)
	return result{out.String(), errb.String(), code}
}

// cleanEnv keeps the caller's environment out of the commands.
func cleanEnv(t *testing.T) {
	for _, k := range []string{"NATS_URL", "NATS_CREDS", "NATS_CONTEXT", "TOOLGATE_TOKEN", "TOOLGATE_TENANT", "NO_COLOR"} {
		t.Setenv(k, "")
	}
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file (go test -update rewrites it)\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// server is a running toolgate serve --examples: its NATS URL and data
// directory.
type server struct{ url, data string }

// flags is the connection part of a command line to s.
func (s server) flags(extra ...string) []string {
	return append(extra, "--nats", s.url, "--data", s.data)
}

// startToolgate runs what `toolgate serve --examples --sandbox none` runs,
// with the serve command's flag defaults, on an embedded server.
func startToolgate(t *testing.T) server {
	t.Helper()
	return startToolgateWith(t, nil)
}

// startToolgateWith is startToolgate with the config changed by change.
func startToolgateWith(t *testing.T, change func(*node.Config)) server {
	t.Helper()
	var c node.Config
	pipelineFlags(pflag.NewFlagSet("test", pflag.ContinueOnError), &c)
	c.Workers = 2
	c.Examples = true
	c.Stage.Sandbox.Mode = "none"
	c.Embedded = node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: t.TempDir()}
	if change != nil {
		change(&c)
	}
	c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	ready := make(chan string, 1)
	c.Ready = func(url string, _ *node.Node) { ready <- url }
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- node.Run(ctx, c) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("node.Run: %v", err)
		}
	})
	select {
	case url := <-ready:
		return server{url, c.Embedded.DataDir}
	case err := <-errc:
		errc <- err
		t.Fatalf("toolgate did not start: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("toolgate did not start in time")
	}
	return server{}
}

// waitFor polls cond until it holds or 20 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHelp: every command answers -h and --help with its help on stdout
// and exit 0; the text is kept in testdata/help-*.golden.
func TestHelp(t *testing.T) {
	cleanEnv(t)
	for _, path := range [][]string{
		{}, {"invoke"}, {"status"}, {"stage"}, {"tools"}, {"tools", "init"}, {"tools", "get"}, {"tools", "import-mcp"},
		{"token"}, {"token", "mint"}, {"approvals"}, {"approvals", "list"}, {"tail"}, {"serve"}, {"cancel"}, {"breakers"},
		{"policy"}, {"hooks"}, {"hooks", "push"}, {"approve"}, {"version"}, {"completion"}, {"console"}, {"docs", "source"},
		{"redrive"}, {"redrive", "run"}, {"policy", "shadow"}, {"receipt"}, {"receipt", "verify"}, {"site"}, {"site", "add"}, {"site", "remove"},
	} {
		name := "help-" + strings.Join(append([]string{"toolgate"}, path...), "-")
		t.Run(name, func(t *testing.T) {
			for _, h := range []string{"-h", "--help"} {
				r := tg(t, "", append(append([]string{}, path...), h)...)
				if r.code != exitOK || r.stderr != "" {
					t.Fatalf("%v %s: exit %d, stderr %q", path, h, r.code, r.stderr)
				}
				if !strings.Contains(r.stdout, "Usage:") {
					t.Fatalf("%v %s printed no usage:\n%s", path, h, r.stdout)
				}
				golden(t, name, r.stdout)
			}
		})
	}
}

// TestUsageErrors: wrong argument counts, unknown flags, bad parameters and
// a missing tenant stop with exit 2 before anything connects (the server
// given does not exist: connecting would exit 3).
func TestUsageErrors(t *testing.T) {
	cleanEnv(t)
	nowhere := []string{"--nats", "nats://127.0.0.1:1", "--data", t.TempDir()}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"second positional", []string{"status", "ID1", "ID2", "--tenant", "t"}, "want an invocation id, got 2"},
		{"tools get without id", []string{"tools", "get", "--version", "1"}, "want a tool id"},
		{"invoke without tool", []string{"invoke", "--tenant", "t"}, "want a tool id"},
		{"unknown flag", []string{"tools", "list", "--bogus"}, "unknown flag: --bogus"},
		{"unknown command", []string{"frobnicate"}, "unknown command"},
		{"unknown subcommand", []string{"tools", "frobnicate"}, `unknown command "frobnicate" for "toolgate tools"`},
		{"no tenant", []string{"status", "ID"}, "no tenant"},
		{"params not an object", []string{"invoke", "echo", "--tenant", "t", "--params", "[1]"}, "--params is not a JSON object"},
		{"params file missing", []string{"invoke", "echo", "--tenant", "t", "--params", "@/nonexistent.json"}, "--params"},
		{"delete needs a version", []string{"tools", "delete", "echo"}, "want a tool id and an exact version"},
		{"import-mcp needs a server", []string{"tools", "import-mcp", "--url", "http://x"}, "required flag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tg(t, "", append(tc.args, nowhere...)...)
			if r.code != exitUsage {
				t.Fatalf("exit %d, want %d; stderr %q", r.code, exitUsage, r.stderr)
			}
			if !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("stderr %q does not say %q", r.stderr, tc.want)
			}
		})
	}
	t.Run("no server", func(t *testing.T) {
		r := tg(t, "", append([]string{"tools", "list"}, nowhere...)...)
		if r.code != exitConnect || !strings.Contains(r.stderr, "connecting to nats://127.0.0.1:1") {
			t.Fatalf("exit %d, stderr %q; want %d and the server named", r.code, r.stderr, exitConnect)
		}
	})
}

// otherKeyToken is a well-formed token for tenant demo signed by a key the
// server does not know.
func otherKeyToken(t *testing.T) string {
	k, err := token.GenerateSigningKey(token.AlgEdDSA)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := token.Mint(k, token.Claims{
		ToolID: token.Patterns{"*"}, TenantID: "demo", AgentDID: node.DevAgent, AllowedOperations: []string{token.OperationExecute},
		RegisteredClaims: jwt.RegisteredClaims{Issuer: "toolgate", Audience: jwt.ClaimStrings{"toolgate"}, Subject: node.DevAgent,
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))},
	})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// noopOnlyToken is a token of the server's development key that grants
// only the noop tool: the bus admits it, the policy refuses echo.
func noopOnlyToken(t *testing.T, s server) string {
	k, err := token.LoadSigningKey(filepath.Join(s.data, "dev-signing-key.jwk"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := token.Mint(k, token.Claims{
		ToolID: token.Patterns{"noop"}, TenantID: "demo", AgentDID: node.DevAgent, AllowedOperations: []string{token.OperationExecute},
		RegisteredClaims: jwt.RegisteredClaims{Issuer: "toolgate", Audience: jwt.ClaimStrings{"toolgate"}, Subject: node.DevAgent,
			ID: "noop-only", IssuedAt: jwt.NewNumericDate(time.Now()), ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))},
	})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestInvokeExitCodes: invoke --wait ends 0 on success, 1 on error, 4 when
// denied, 5 on timeout and 6 when cancelled, with the result shown in text
// and under --json; the tenant comes from the development token.
func TestInvokeExitCodes(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		status api.Status
		say    string
	}{
		{"success", []string{"invoke", "echo", "--params", `{"message":"hi"}`}, exitOK, api.StatusSuccess, `"message": "hi"`},
		{"error", []string{"invoke", "echo", "--params", `{}`}, exitError, api.StatusError, "E3015"},
		{"denied", []string{"invoke", "echo", "--params", `{"message":"hi"}`, "--token", noopOnlyToken(t, s)}, exitDenied, api.StatusPermissionDenied, "permission_denied"},
		{"timeout", []string{"invoke", "sleep", "--params", `{"ms":5000}`, "--timeout", "1s"}, exitTimeout, api.StatusTimeout, "E3103"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Flags after the tool id, and before it.
			r := tg(t, "", s.flags(append(tc.args, "--wait")...)...)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout %s\nstderr %s", r.code, tc.code, r.stdout, r.stderr)
			}
			if !strings.HasPrefix(r.stdout, string(tc.status)+"  ") || !strings.Contains(r.stdout, tc.say) {
				t.Fatalf("text output does not show %s and %q:\n%s", tc.status, tc.say, r.stdout)
			}
			j := tg(t, "", s.flags(append([]string{tc.args[0], "--json", "--wait"}, tc.args[1:]...)...)...)
			var resp api.Response
			if err := json.Unmarshal([]byte(j.stdout), &resp); err != nil || resp.Status != tc.status || j.code != tc.code {
				t.Fatalf("--json: exit %d, status %q, err %v:\n%s", j.code, resp.Status, err, j.stdout)
			}
		})
	}
	t.Run("cancelled", func(t *testing.T) {
		id := "cli-cancel-1"
		done := make(chan result, 1)
		go func() {
			done <- tg(t, "", s.flags("invoke", "sleep", "--params", `{"ms":20000}`, "--id", id, "--wait")...)
		}()
		waitFor(t, "the call to run", func() bool {
			r := tg(t, "", s.flags("status", id, "--json")...)
			return strings.Contains(r.stdout, `"status": "running"`)
		})
		if r := tg(t, "", s.flags("cancel", id, "--reason", "test")...); r.code != exitOK || !strings.Contains(r.stdout, "cancel requested for "+id) {
			t.Fatalf("cancel: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		r := <-done
		if r.code != exitCancelled || !strings.HasPrefix(r.stdout, "cancelled  ") {
			t.Fatalf("invoke --wait of a cancelled call: exit %d, want %d\n%s%s", r.code, exitCancelled, r.stdout, r.stderr)
		}
		if r := tg(t, "", s.flags("status", id)...); r.code != exitCancelled || !strings.HasPrefix(r.stdout, "cancelled  sleep@1.0.0  "+id+"  tenant demo") {
			t.Fatalf("status: exit %d\n%s", r.code, r.stdout)
		}
	})
	t.Run("params from stdin and file", func(t *testing.T) {
		r := tg(t, `{"message":"from stdin"}`, s.flags("invoke", "echo", "--params", "-", "--wait", "--json")...)
		if r.code != exitOK || !strings.Contains(r.stdout, "from stdin") {
			t.Fatalf("--params -: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		f := filepath.Join(t.TempDir(), "p.json")
		if err := os.WriteFile(f, []byte(`{"message":"from a file"}`), 0o644); err != nil {
			t.Fatal(err)
		}
		r = tg(t, "", s.flags("invoke", "echo", "--params", "@"+f, "--wait", "--json")...)
		if r.code != exitOK || !strings.Contains(r.stdout, "from a file") {
			t.Fatalf("--params @file: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
	})
	t.Run("wait gives up", func(t *testing.T) {
		r := tg(t, "", s.flags("invoke", "sleep", "--params", `{"ms":3000}`, "--wait", "--wait-timeout", "300ms")...)
		if r.code != exitTimeout || !strings.Contains(r.stderr, "still ") {
			t.Fatalf("exit %d, want %d\n%s%s", r.code, exitTimeout, r.stdout, r.stderr)
		}
	})
}

// TestFlagsAnywhere: flags after a second positional, and a value flag
// before the positional, are both read.
func TestFlagsAnywhere(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	r := tg(t, "", "tools", "get", "--version", "1.0.0", "echo", "--nats", s.url, "--json", "--data", s.data)
	var m struct{ ID, Version string }
	if err := json.Unmarshal([]byte(r.stdout), &m); err != nil || r.code != exitOK || m.ID != "echo" || m.Version != "1.0.0" {
		t.Fatalf("tools get --version 1.0.0 echo: exit %d, %+v, %v\n%s", r.code, m, err, r.stderr)
	}
	// A tenant from --tenant overrides the token's, wherever it stands.
	id := tg(t, "", s.flags("invoke", "echo", "--params", `{"message":"x"}`, "--wait", "--json")...)
	var resp api.Response
	if err := json.Unmarshal([]byte(id.stdout), &resp); err != nil {
		t.Fatal(err)
	}
	if r := tg(t, "", "status", resp.InvocationID, "--tenant", "other", "--nats", s.url, "--data", s.data); r.code != exitError || !strings.Contains(r.stderr, "E3025") {
		t.Fatalf("status in another tenant: exit %d, %q", r.code, r.stderr)
	}
}

// TestToolsLifecycle: tools init writes a manifest that passes the schema
// and registers; deprecate, sunset and delete go through the control
// service.
func TestToolsLifecycle(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	file := filepath.Join(t.TempDir(), "t.json")
	if r := tg(t, "", "tools", "init", "my.tool", "--out", file); r.code != exitOK {
		t.Fatalf("init: exit %d %s", r.code, r.stderr)
	}
	doc, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	m, err := tools.Parse(doc)
	if err != nil {
		t.Fatalf("tools init wrote an invalid manifest: %v", err)
	}
	for _, section := range []string{"safety", "limits", "rate_limit", "retry_policy", "circuit_breaker", "cost", "lifecycle", "output_schema"} {
		if !bytes.Contains(doc, []byte(`"`+section+`"`)) {
			t.Errorf("the manifest lacks %s", section)
		}
	}
	if r := tg(t, "", "tools", "init", "my.tool", "--out", file); r.code == exitOK {
		t.Fatal("init replaced an existing file without --force")
	}
	steps := []struct {
		args []string
		out  string
	}{
		{[]string{"tools", "register", file}, "registered my.tool@0.1.0"},
		{[]string{"invoke", "my.tool", "--params", `{"message":"m"}`, "--wait"}, `"message": "m"`},
		{[]string{"tools", "deprecate", "my.tool", "0.1.0", "--in-favor-of", "echo"}, "my.tool@0.1.0 is deprecated"},
		{[]string{"invoke", "my.tool", "--params", `{"message":"m"}`, "--wait"}, "warning:"},
		{[]string{"tools", "sunset", "my.tool", "0.1.0", "--at", "2030-01-01T00:00:00Z"}, "my.tool@0.1.0 becomes sunset at 2030-01-01T00:00:00Z"},
		{[]string{"tools", "get", "my.tool", "--version", "0.1.0"}, `"sunset_at": "2030-01-01T00:00:00Z"`},
		{[]string{"tools", "get", "my.tool", "--version", "0.1.0"}, `"deprecated_in_favor_of": "echo"`}, // earlier members kept
		{[]string{"tools", "search", "--source", "builtin", "--enabled-only"}, "echo"},
		{[]string{"tools", "search", "my", "tool"}, "my.tool"},
		{[]string{"tools", "stats"}, "TOOL"},
		{[]string{"tools", "sunset", "my.tool", "0.1.0"}, "my.tool@0.1.0 is sunset"},
		{[]string{"tools", "search", "my", "tool", "--json"}, `"tools": []`}, // a sunset version serves no search
		{[]string{"tools", "delete", "my.tool", "0.1.0"}, "removed my.tool@0.1.0"},
		{[]string{"tools", "get", "my.tool", "--version", "0.1.0"}, `"state": "removed"`}, // kept for the record
		{[]string{"tools", "list", "--all"}, "removed"},
		{[]string{"tools", "purge", "my.tool@0.1.0"}, "purged my.tool@0.1.0"},
	}
	for i, st := range steps {
		r := tg(t, "", s.flags(st.args...)...)
		if (i == 1 || i == 3) && (r.code != exitOK || !strings.Contains(r.stdout, st.out)) {
			// The stages learn of a registration, and of a deprecation,
			// through their watch, a moment after the command returns.
			waitFor(t, "the stages to know "+strings.Join(steps[i-1].args[:2], " "), func() bool {
				r = tg(t, "", s.flags(st.args...)...)
				return r.code == exitOK && strings.Contains(r.stdout, st.out)
			})
		}
		if r.code != exitOK || !strings.Contains(r.stdout, st.out) {
			t.Fatalf("%v: exit %d, want %q in\n%s%s", st.args, r.code, st.out, r.stdout, r.stderr)
		}
	}
	if r := tg(t, "", s.flags("tools", "get", m.ID)...); r.code != exitError || !strings.Contains(r.stderr, "E3001") {
		t.Fatalf("get after purge: exit %d %q", r.code, r.stderr)
	}
	r := tg(t, "", s.flags("tools", "list")...)
	lines := strings.Split(r.stdout, "\n")
	if !strings.HasPrefix(lines[0], "TOOL ") || !strings.Contains(r.stdout, "\necho ") || strings.Contains(r.stdout, "my.tool") {
		t.Fatalf("tools list:\n%s", r.stdout)
	}
}

// TestApprovals: a call that needs a human is reported as pending approval
// while invoke waits, approvals list and show name it with its parameters
// redacted, and approving it lets invoke end 0.
func TestApprovals(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	man := initManifest("needs.human")
	man["safety"].(map[string]any)["requires_approval"] = true
	man["input_schema"] = map[string]any{"type": "object"}
	doc, _ := json.Marshal(man)
	if r := tg(t, string(doc), s.flags("tools", "register", "-")...); r.code != exitOK {
		t.Fatalf("register: %d %s", r.code, r.stderr)
	}
	id := "cli-approval-1"
	var stderr syncBuffer
	var stdout bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(t.Context(), s.flags("invoke", "needs.human", "--id", id, "--wait",
			"--params", `{"message":"pay","password":"hunter2"}`), strings.NewReader(""), &stdout, &stderr)
	}()
	waitFor(t, "the pending approval notice", func() bool {
		return strings.Contains(stderr.String(), "pending approval: toolgate approve "+id+" --tenant demo")
	})
	r := tg(t, "", s.flags("approvals", "list")...)
	if r.code != exitOK || !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "needs.human@0.1.0") || strings.Contains(r.stdout, "hunter2") {
		t.Fatalf("approvals list: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := tg(t, "", s.flags("approvals", "list", "--tenant", "other", "--json")...); r.code != exitOK || strings.Contains(r.stdout, id) {
		t.Fatalf("another tenant's approvals list shows %s: exit %d\n%s", id, r.code, r.stdout)
	}
	r = tg(t, "", s.flags("approvals", "show", id, "--json")...)
	var a api.ApprovalSummary
	if err := json.Unmarshal([]byte(r.stdout), &a); err != nil || a.State != "pending" || a.Deadline.IsZero() ||
		!strings.Contains(string(a.Parameters), `"pay"`) || strings.Contains(string(a.Parameters), "hunter2") {
		t.Fatalf("approvals show: %v %+v\n%s", err, a, r.stdout)
	}
	// A named operator's credentials, issued from the deployment's keys:
	// the decision records her, not the local operator.
	alice := filepath.Join(t.TempDir(), "alice.creds")
	if r := tg(t, "", "--data", s.data, "creds", "issue", "--name", "alice", "--role", "operator", "--ttl", "1h", "--out", alice); r.code != exitOK ||
		!strings.Contains(r.stdout, "operator:alice credentials in "+alice) {
		t.Fatalf("creds issue: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := tg(t, "", "--data", s.data, "creds", "issue", "--name", "alice", "--out", alice); r.code == exitOK || !strings.Contains(r.stderr, "exists") {
		t.Fatalf("creds issue over existing files: exit %d\n%s", r.code, r.stderr)
	}
	if r := tg(t, "", s.flags("approve", id, "--reason", "ok", "--creds", alice)...); r.code != exitOK || !strings.Contains(r.stdout, "approved "+id) {
		t.Fatalf("approve: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = tg(t, "", s.flags("approvals", "show", id, "--json")...)
	if err := json.Unmarshal([]byte(r.stdout), &a); err != nil || a.DecidedBy != "operator:alice" {
		t.Fatalf("approval decided by %q, want operator:alice (%v)\n%s", a.DecidedBy, err, r.stdout)
	}
	select {
	case code := <-done:
		if code != exitOK || !strings.HasPrefix(stdout.String(), "success  ") {
			t.Fatalf("invoke after approval: exit %d\n%s", code, stdout.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("invoke did not end after the approval")
	}
	if r := tg(t, "", s.flags("tail", "--all", "--count", "4")...); r.code != exitOK || !strings.Contains(r.stdout, "tool.approval.requested") {
		t.Fatalf("tail: exit %d\n%s", r.code, r.stdout)
	}
}

// TestTokenInspectExit: a token that does not verify against --jwks exits 4;
// one that does exits 0.
func TestTokenInspectExit(t *testing.T) {
	cleanEnv(t)
	dir := t.TempDir()
	key, jwks := filepath.Join(dir, "k.jwk"), filepath.Join(dir, "jwks.json")
	if r := tg(t, "", "token", "keygen", "--out", key, "--jwks", jwks); r.code != exitOK {
		t.Fatal(r.stderr)
	}
	mint := tg(t, "", "token", "mint", "--key", key, "--tenant", "acme", "--agent", "did:agent:a", "--tools", "fs.*,echo", "--tools", "math.eval")
	if mint.code != exitOK {
		t.Fatal(mint.stderr)
	}
	tok := strings.TrimSpace(mint.stdout)
	r := tg(t, "", "token", "inspect", tok, "--jwks", jwks)
	if r.code != exitOK || !strings.Contains(r.stdout, "tenant:") || !strings.Contains(r.stdout, "fs.*,echo,math.eval") {
		t.Fatalf("inspect: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := tg(t, "", "token", "inspect", otherKeyToken(t), "--jwks", jwks); r.code != exitDenied || !strings.Contains(r.stdout, "does NOT verify") {
		t.Fatalf("inspect of a foreign token: exit %d\n%s", r.code, r.stdout)
	}
	if r := tg(t, "", "token", "inspect", "not-a-token"); r.code != exitError {
		t.Fatalf("inspect of garbage: exit %d", r.code)
	}
}

// TestKeygenRefusesToReplaceKeys: an existing key or key set is kept unless
// --force is given, since a new key invalidates every token issued.
func TestKeygenRefusesToReplaceKeys(t *testing.T) {
	dir := t.TempDir()
	key, jwks := filepath.Join(dir, "k.jwk"), filepath.Join(dir, "jwks.json")
	o := keygenOptions{alg: token.AlgEdDSA, out: key, jwks: jwks}
	if _, err := keygen(o); err != nil {
		t.Fatal(err)
	}
	oldKey, _ := os.ReadFile(key)
	oldSet, _ := os.ReadFile(jwks)
	if _, err := keygen(o); err == nil {
		t.Fatal("keygen replaced an existing key without --force")
	}
	if err := os.Remove(key); err != nil {
		t.Fatal(err)
	}
	if _, err := keygen(o); err == nil {
		t.Fatal("keygen replaced an existing key set without --force")
	}
	if _, err := os.Stat(key); !os.IsNotExist(err) {
		t.Fatal("a refused keygen wrote the key")
	}
	if set, _ := os.ReadFile(jwks); !bytes.Equal(set, oldSet) {
		t.Fatal("a refused keygen changed the key set")
	}
	o.force = true
	if _, err := keygen(o); err != nil {
		t.Fatal(err)
	}
	if newKey, _ := os.ReadFile(key); len(newKey) == 0 || bytes.Equal(newKey, oldKey) {
		t.Fatal("--force did not write a new key")
	}
}

// TestRender: results, records and audit lines as people see them, kept in
// testdata/render-*.golden.
func TestRender(t *testing.T) {
	a := &app{}
	at := time.Date(2026, 11, 23, 15, 4, 5, 0, time.UTC)
	md := &api.ExecutionMetadata{DurationMS: 12, ToolID: "echo", ToolVersion: "2.0.0", Warnings: []string{"echo@1.0.0 is deprecated"}}
	for _, tc := range []struct {
		name   string
		render func(w io.Writer) error
	}{
		{"response-success", func(w io.Writer) error {
			return a.renderResponse(w, api.Response{InvocationID: "inv-1", Status: api.StatusSuccess, Result: json.RawMessage(`{"message":"hi","n":[1,2]}`), ExecutionMetadata: md})
		}},
		{"response-error", func(w io.Writer) error {
			return a.renderResponse(w, api.Response{InvocationID: "inv-2", Status: api.StatusError,
				Error:             &api.Error{Code: api.InvalidParameters, ECode: "E3015", Message: "parameters do not match", Fields: []api.FieldError{{Location: "/", Message: "missing properties: 'message'"}}},
				ExecutionMetadata: &api.ExecutionMetadata{ToolID: "echo"}})
		}},
		{"record-pending-approval", func(w io.Writer) error {
			return a.renderRecord(w, api.Record{InvocationID: "inv-3", Tenant: "acme", Status: api.StatusPendingApproval, ToolID: "pay", ToolVersion: "1.0.0", UpdatedAt: at})
		}},
		{"record-running", func(w io.Writer) error {
			return a.renderRecord(w, api.Record{InvocationID: "inv-4", Tenant: "acme", Status: api.StatusRunning, ToolID: "sleep", ToolVersion: "1.0.0", UpdatedAt: at,
				Progress: &api.Progress{Percent: 40, Message: "copying"}})
		}},
		{"audit-lines", func(w io.Writer) error {
			for _, ev := range []struct{ subject, data string }{
				{"audit.demo.tool.succeeded", `{"time":"2026-11-23T15:04:05.123Z","type":"ai.agent.tool.succeeded","data":{"tenant_id":"demo","invocation_id":"inv-1","tool_id":"echo","tool_version":"2.0.0","status":"success"}}`},
				{"audit.demo.tool.timeout", `{"time":"2026-11-23T15:04:06Z","data":{"tenant_id":"demo","invocation_id":"inv-5","tool_id":"sleep","tool_version":"1.0.0","status":"timeout","error":{"code":"timeout","message":"x","details":{"e_code":"E3103"}}}}`},
				{"audit._system.circuit.opened", `{"time":"2026-11-23T15:04:07Z","data":{"key":"http.get"}}`},
			} {
				if _, err := io.WriteString(w, a.renderAudit(ev.subject, []byte(ev.data))+"\n"); err != nil {
					return err
				}
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.render(&b); err != nil {
				t.Fatal(err)
			}
			golden(t, "render-"+tc.name, b.String())
		})
	}
}

// TestCompletionAndVersion: completion scripts are generated for each
// shell, stage names complete, and version lists the modules built in.
func TestCompletionAndVersion(t *testing.T) {
	cleanEnv(t)
	for shell, marker := range map[string]string{"bash": "__start_toolgate", "zsh": "#compdef toolgate", "fish": "complete -c toolgate"} {
		t.Run(shell, func(t *testing.T) {
			r := tg(t, "", "completion", shell)
			if r.code != exitOK || !strings.Contains(r.stdout, marker) {
				t.Fatalf("completion %s: exit %d, no %q", shell, r.code, marker)
			}
		})
	}
	r := tg(t, "", "__complete", "stage", "")
	if !strings.Contains(r.stdout, "execute\n") || !strings.Contains(r.stdout, "control\n") {
		t.Fatalf("stage names do not complete:\n%s", r.stdout)
	}
	r = tg(t, "", "version", "--json")
	var v struct {
		GoVersion string `json:"go_version"`
		Modules   []struct{ Path, Version string }
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || r.code != exitOK || v.GoVersion == "" {
		t.Fatalf("version: exit %d %v\n%s", r.code, err, r.stdout)
	}
	found := false
	for _, m := range v.Modules {
		found = found || (m.Path == "github.com/spf13/cobra" && m.Version != "")
	}
	if !found {
		t.Fatalf("version lists no cobra module: %+v", v.Modules)
	}
}

// TestColour: status words are coloured only when asked (a terminal
// without NO_COLOR); the golden renderings are plain.
func TestColour(t *testing.T) {
	var b bytes.Buffer
	if err := (&app{color: true}).renderResponse(&b, api.Response{InvocationID: "i", Status: api.StatusSuccess}); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.String(), green+"success"+reset) {
		t.Fatalf("no colour: %q", b.String())
	}
	t.Setenv("NO_COLOR", "1")
	var out bytes.Buffer
	if code := run(t.Context(), []string{"version"}, strings.NewReader(""), &out, io.Discard); code != exitOK || strings.Contains(out.String(), "\x1b[") {
		t.Fatalf("exit %d, escape codes in %q", code, out.String())
	}
}

// TestInterrupt: a command whose context ends (Ctrl-C) exits 130, and an
// interrupted invoke --wait says the call goes on.
func TestInterrupt(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	ctx, cancel := context.WithCancel(t.Context())
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, s.flags("invoke", "sleep", "--params", `{"ms":5000}`, "--wait"), strings.NewReader(""), &out, &errb)
	}()
	waitFor(t, "the call to run", func() bool { return strings.Contains(errb.String(), "running") })
	cancel()
	select {
	case code := <-done:
		if code != exitInterrupt || !strings.Contains(errb.String(), "the call goes on") {
			t.Fatalf("exit %d, want %d; stderr %q", code, exitInterrupt, errb.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("invoke did not stop when interrupted")
	}
}

// TestImportMCP: import-mcp lists a streamable-HTTP server's tools and
// registers each as mcp:NAME:TOOL; --dry-run only prints the manifests.
func TestImportMCP(t *testing.T) {
	cleanEnv(t)
	srv := mcp.NewServer(&mcp.Implementation{Name: "remote", Version: "1.0.0"}, nil)
	type in struct{ A, B int }
	type out struct {
		Sum int `json:"sum"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "add", Description: "adds"}, func(_ context.Context, _ *mcp.CallToolRequest, a in) (*mcp.CallToolResult, out, error) {
		return nil, out{Sum: a.A + a.B}, nil
	})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	s := startToolgate(t)
	dry := tg(t, "", s.flags("tools", "import-mcp", "--server", "remote", "--url", hs.URL+"/mcp", "--dry-run")...)
	if dry.code != exitOK || !strings.Contains(dry.stdout, `"mcp:remote:add"`) {
		t.Fatalf("--dry-run: exit %d\n%s%s", dry.code, dry.stdout, dry.stderr)
	}
	if r := tg(t, "", s.flags("tools", "get", "mcp:remote:add")...); r.code != exitError {
		t.Fatalf("--dry-run registered the tool: exit %d", r.code)
	}
	r := tg(t, "", s.flags("tools", "import-mcp", "--server", "remote", "--url", hs.URL+"/mcp", "--risk", "low", "--side-effects", "net.post,fs.write")...)
	if r.code != exitOK || !strings.Contains(r.stdout, "registered mcp:remote:add@1.0.0") {
		t.Fatalf("import: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = tg(t, "", s.flags("tools", "get", "mcp:remote:add")...)
	if r.code != exitOK || !strings.Contains(r.stdout, `"net.post"`) || !strings.Contains(r.stdout, `"fs.write"`) {
		t.Fatalf("get: exit %d\n%s", r.code, r.stdout)
	}
}

// TestOperatorCommands: breakers, policy and revocation go through the
// control service, in text and JSON; the record names the operator whose
// credentials signed the request, not --by.
func TestOperatorCommands(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	steps := []struct {
		args []string
		out  string
	}{
		{[]string{"breakers", "open", "echo", "--by", "tester"}, "echo is open"},
		{[]string{"breakers"}, "forced by operator:local"},
		{[]string{"breakers", "release", "echo"}, "echo is closed"},
		{[]string{"breakers", "list", "--json"}, `"state": "closed"`},
		{[]string{"policy", "show"}, "no policy pushed"},
		{[]string{"policy", "push", "../../internal/policy", "--by", "tester"}, "policy pushed (revision"},
		{[]string{"policy", "show", "--json"}, `"pushed_by": "operator:local"`},
		{[]string{"policy", "reset"}, "removed; workers return to their configured policy"},
		{[]string{"policy", "show"}, "no policy pushed"},
		{[]string{"policy", "reset", "--json"}, `"removed_revision": 0`},
		{[]string{"token", "revoke", "--jti", "some-token-id", "--reason", "test"}, "revoked some-token-id"},
	}
	for i, st := range steps {
		r := tg(t, "", s.flags(st.args...)...)
		if (i == 1 || i == 3) && (r.code != exitOK || !strings.Contains(r.stdout, st.out)) {
			// The stages learn of a registration, and of a deprecation,
			// through their watch, a moment after the command returns.
			waitFor(t, "the stages to know "+strings.Join(steps[i-1].args[:2], " "), func() bool {
				r = tg(t, "", s.flags(st.args...)...)
				return r.code == exitOK && strings.Contains(r.stdout, st.out)
			})
		}
		if r.code != exitOK || !strings.Contains(r.stdout, st.out) {
			t.Fatalf("%v: exit %d, want %q in\n%s%s", st.args, r.code, st.out, r.stdout, r.stderr)
		}
	}
}

// TestWaitShowsProgress: while invoke --wait waits, the progress a tool
// reports appears on stderr.
func TestWaitShowsProgress(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	doc := `{"id":"test.progress","name":"progress","version":"1.0.0","description":"reports progress","kind":"cli",
	  "cli":{"command":["sh","-c","echo 'toolgate:progress 40 halfway there'; sleep 2; echo '{}'"],"stdin":"none"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"}}`
	if r := tg(t, doc, s.flags("tools", "register", "-")...); r.code != exitOK {
		t.Fatalf("register: %d %s", r.code, r.stderr)
	}
	r := tg(t, "", s.flags("invoke", "test.progress", "--wait")...)
	if strings.Contains(r.stdout, "E3001") {
		// The stages learn of a registration through their watch, a
		// moment after register returns (docs/tools.md).
		waitFor(t, "the stages to know test.progress", func() bool {
			r = tg(t, "", s.flags("invoke", "test.progress", "--wait")...)
			return !strings.Contains(r.stdout, "E3001")
		})
	}
	if r.code != exitOK || !strings.Contains(r.stderr, "running: 40% halfway there") {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
	}
}
