package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/pflag"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
)

// freeAddr is a loopback address with a port nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestServeWritesTokenBeforeListening: a script that waits for the port
// and then reads the development token finds it; and Ctrl-C or SIGTERM
// after a clean drain ends serve with status 0.
func TestServeWritesTokenBeforeListening(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			addr := freeAddr(t)
			cmd := toolgateCmd(t, dir, nil, "serve", "--examples", "--data", "data", "--sandbox", "none", "--listen", addr, "--log-level", "warn")
			cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			deadline := time.Now().Add(60 * time.Second)
			for {
				if c, err := net.Dial("tcp", addr); err == nil {
					c.Close()
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("serve did not listen in time")
				}
				time.Sleep(2 * time.Millisecond)
			}
			if _, err := os.Stat(filepath.Join(dir, "data", "dev-token")); err != nil {
				t.Errorf("the port is open but the development token is not there: %v", err)
			}
			if _, err := os.Stat(filepath.Join(dir, "data", "busauth", "operator.jwt")); err != nil {
				t.Errorf("the port is open but the operator's credentials are not there: %v", err)
			}
			// Let it come up fully, then stop it as Ctrl-C would.
			waitFor(t, "serve to answer", func() bool {
				r := tg(t, "", "tools", "list", "--nats", "nats://"+addr, "--data", filepath.Join(dir, "data"))
				return r.code == exitOK
			})
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			err := cmd.Wait()
			if err != nil {
				t.Fatalf("serve after %s: %v, want exit status 0", sig, err)
			}
		})
	}
}

// runServe runs serve --examples on data directory dir until the returned
// function stops it.
func runServe(t *testing.T, dir string) (url string, stop func()) {
	t.Helper()
	var c node.Config
	pipelineFlags(pflag.NewFlagSet("test", pflag.ContinueOnError), &c)
	c.Workers = 2
	c.Examples = true
	c.Stage.Sandbox.Mode = "none"
	c.Embedded = node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: dir}
	c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	ready := make(chan string, 1)
	c.Ready = func(url string, _ *node.Node) { ready <- url }
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- node.Run(ctx, c) }()
	stop = func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("node.Run: %v", err)
		}
	}
	select {
	case url = <-ready:
		return url, stop
	case err := <-errc:
		t.Fatalf("toolgate did not start: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("toolgate did not start in time")
	}
	return "", nil
}

// TestOperatorCredsSurviveRestart: what a user exported from the operator's
// credentials still connects after serve restarts on the same data
// directory; creds rotate issues new ones, which connect too.
func TestOperatorCredsSurviveRestart(t *testing.T) {
	cleanEnv(t)
	dir := t.TempDir()
	jwtPath := filepath.Join(dir, "busauth", "operator.jwt")
	read := func() string {
		b, err := os.ReadFile(jwtPath)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	_, stop := runServe(t, dir)
	exported := read()
	stop()
	url, stop := runServe(t, dir)
	defer stop()
	if got := read(); got != exported {
		t.Errorf("operator.jwt changed across a restart")
	}
	t.Setenv("NATS_NKEY", filepath.Join(dir, "busauth", "operator.nk"))
	t.Setenv("NATS_TOKEN", exported)
	if r := tg(t, "", "policy", "show", "--nats", url); r.code != exitOK {
		t.Fatalf("the exported operator token after a restart: exit %d\n%s", r.code, r.stderr)
	}
	if r := tg(t, "", "creds", "rotate", "--data", dir); r.code != exitOK || !strings.Contains(r.stdout, "NATS_TOKEN") {
		t.Fatalf("creds rotate: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	rotated := read()
	if rotated == exported {
		t.Fatal("creds rotate left operator.jwt as it was")
	}
	t.Setenv("NATS_TOKEN", rotated)
	if r := tg(t, "", "policy", "show", "--nats", url); r.code != exitOK {
		t.Fatalf("the rotated operator token: exit %d\n%s", r.code, r.stderr)
	}
}

// TestMakeRunInterrupt: Ctrl-C on `make run` after a clean drain is no
// error of make's: serve exits 0 (TestServeWritesTokenBeforeListening), and
// make, which Ctrl-C interrupts too, reports no failed recipe (go run exits
// 1 on any interrupt: "make: *** [Makefile:9: run] Error 1").
func TestMakeRunInterrupt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds toolgate with make")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	// The binary goes to a directory of the test's own: the checkout stays
	// as it was for the tests running beside this one (docs' checks it).
	cmd := exec.Command("make", "-s", "run", "BIN="+t.TempDir(), "DATA="+data, "LISTEN="+freeAddr(t), "METRICS="+freeAddr(t))
	cmd.Dir = repo
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	running, scanned := make(chan struct{}), make(chan struct{})
	var log strings.Builder
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "toolgate running") {
				close(running)
			}
		}
	}()
	select {
	case <-running:
	case <-time.After(8 * time.Minute):
		t.Fatal("make run did not start toolgate in time")
	}
	// Ctrl-C in a terminal signals the whole foreground process group.
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGINT) {
		t.Errorf("make run after Ctrl-C: %v, want exit status 0 or make's own interrupt", err)
	}
	<-scanned
	if strings.Contains(log.String(), "Error") {
		t.Errorf("make run after Ctrl-C reports an error:\n%s", log.String())
	}
}

// TestFirstCommands: tail --all ends at the end of the stored trail (for an
// operator and an agent); status --wait waits with invoke --wait's exit
// codes; a broken --params says where; an unknown tool or command says what
// was meant.
func TestFirstCommands(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	if r := tg(t, "", s.flags("invoke", "echo", "--params", `{"message":"m"}`, "--wait")...); r.code != exitOK {
		t.Fatalf("invoke: %d %s", r.code, r.stderr)
	}
	tok := agentToken(t, s, "first-agent", time.Hour, "echo", "sleep")
	t.Run("tail --all ends", func(t *testing.T) {
		for name, args := range map[string][]string{
			"operator": s.flags("tail", "--all", "--json"),
			"agent":    {"tail", "--all", "--json", "--nats", s.url, "--token", tok},
		} {
			ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
			var out, errb syncBuffer
			code := run(ctx, args, strings.NewReader(""), &out, &errb)
			followed := ctx.Err() != nil
			cancel()
			if followed || code != exitOK || strings.Count(out.String(), "\n") < 2 {
				t.Errorf("%s: tail --all: exit %d, still following after 15s: %v, %d lines\n%s", name, code, followed, strings.Count(out.String(), "\n"), errb.String())
			}
		}
	})
	t.Run("status --wait", func(t *testing.T) {
		r := tg(t, "", "invoke", "sleep", "--params", `{"ms":1000}`, "--json", "--nats", s.url, "--token", tok)
		var resp api.Response
		if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &resp) != nil {
			t.Fatalf("invoke: %d %s", r.code, r.stderr)
		}
		if r := tg(t, "", "status", resp.InvocationID, "--wait", "--wait-timeout", "100ms", "--nats", s.url, "--token", tok); r.code != exitTimeout {
			t.Errorf("status --wait giving up first: exit %d, want %d\n%s", r.code, exitTimeout, r.stderr)
		}
		r = tg(t, "", "status", resp.InvocationID, "--wait", "--json", "--nats", s.url, "--token", tok)
		var done api.Response
		if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &done) != nil || done.Status != api.StatusSuccess {
			t.Errorf("status --wait: exit %d, %s\n%s", r.code, r.stdout, r.stderr)
		}
	})
	t.Run("params syntax", func(t *testing.T) {
		r := tg(t, "", s.flags("invoke", "echo", "--params", `{"message":"x"`)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "line 1, column") || !strings.Contains(r.stderr, "offset 14") || !strings.Contains(r.stderr, "unexpected end") {
			t.Errorf("--params cut short: exit %d\n%s", r.code, r.stderr)
		}
		r = tg(t, "", s.flags("invoke", "echo", "--params", "{\n \"a\": 1,\n \"b\" 2}")...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "line 3, column 6") {
			t.Errorf("--params with a missing colon: exit %d\n%s", r.code, r.stderr)
		}
		r = tg(t, "", s.flags("invoke", "echo", "--params", `["x"]`)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "JSON array") {
			t.Errorf("--params an array: exit %d\n%s", r.code, r.stderr)
		}
	})
	t.Run("did you mean", func(t *testing.T) {
		r := tg(t, "", s.flags("invoke", "ech", "--params", `{"message":"x"}`, "--wait")...)
		out := r.stdout + r.stderr
		if r.code == exitOK || !strings.Contains(out, "E3001") || !strings.Contains(out, "did you mean echo") || !strings.Contains(out, "tools list") {
			t.Errorf("unknown tool: exit %d\n%s", r.code, out)
		}
		r = tg(t, "", s.flags("invoke", "read_file", "--wait", "--json")...)
		var resp api.Response
		if json.Unmarshal([]byte(r.stdout), &resp) != nil || resp.Error == nil || !strings.Contains(strings.Join(anyStrings(resp.Error.Details["did_you_mean"]), ","), "fs.read_file") {
			t.Errorf("unknown tool, --json: details lack did_you_mean fs.read_file\n%s%s", r.stdout, r.stderr)
		}
		for _, args := range [][]string{{"tools", "lst"}, {"creds", "rotat"}} {
			r := tg(t, "", args...)
			if r.code != exitUsage || !strings.Contains(r.stderr, "did you mean") {
				t.Errorf("%q: exit %d\n%s", args, r.code, r.stderr)
			}
		}
	})
}

func anyStrings(v any) []string {
	var out []string
	if l, ok := v.([]any); ok {
		for _, x := range l {
			if s, ok := x.(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// TestExplicitCredentialsWin: an explicit --context or --creds wins over a
// token exported in the environment (the README's order: export, then a
// context), and a refusal names the credential used and where it came from.
func TestExplicitCredentialsWin(t *testing.T) {
	cleanEnv(t)
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	s := startToolgate(t)
	opCreds := filepath.Join(s.data, "busauth", "operator.creds")
	if r := tg(t, "", "creds", "context", "tg-op", "--creds", opCreds, "--nats", s.url); r.code != exitOK {
		t.Fatalf("creds context: exit %d\n%s", r.code, r.stderr)
	}
	t.Setenv("TOOLGATE_TOKEN", agentToken(t, s, "env-agent", time.Hour, "echo"))
	for _, args := range [][]string{{"--context", "tg-op"}, {"--creds", opCreds}} {
		if r := tg(t, "", append([]string{"policy", "show", "--nats", s.url}, args...)...); r.code != exitOK {
			t.Errorf("%q with TOOLGATE_TOKEN exported: exit %d\n%s", args, r.code, r.stderr)
		}
	}
	t.Setenv("TOOLGATE_TOKEN", otherKeyToken(t))
	if r := tg(t, "", "status", "x", "--nats", s.url); r.code != exitRefused || !strings.Contains(r.stderr, "$TOOLGATE_TOKEN") {
		t.Errorf("refused env token: exit %d, want %d naming $TOOLGATE_TOKEN\n%s", r.code, exitRefused, r.stderr)
	}
	t.Setenv("TOOLGATE_TOKEN", "")
	if r := tg(t, "", "status", "x", "--nats", s.url, "--token", otherKeyToken(t)); r.code != exitRefused || !strings.Contains(r.stderr, "--token") {
		t.Errorf("refused --token: exit %d, want %d naming --token\n%s", r.code, exitRefused, r.stderr)
	}
}

// TestGarbageTokenOneVoice: a capability token that is no JWT is refused
// with one code, message and exit status, whether the command line sees it
// before connecting (a tenant to act for is read from it) or the bus does.
func TestGarbageTokenOneVoice(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	for _, args := range [][]string{
		{"status", "x", "--token", "garbage"},                     // the tenant is read from the token first
		{"status", "x", "--token", "garbage", "--tenant", "demo"}, // the bus refuses it
	} {
		r := tg(t, "", append(args, "--nats", s.url)...)
		if r.code != exitRefused || !strings.Contains(r.stderr, "E3223") || !strings.Contains(r.stderr, "it is malformed") || !strings.Contains(r.stderr, "--token") {
			t.Errorf("%q: exit %d, want %d, E3223, malformed, --token\n%s", args, r.code, exitRefused, r.stderr)
		}
	}
	// Over MCP the client is told the same, as an error it shows.
	cmd := toolgateCmd(t, t.TempDir(), []string{"TOOLGATE_TOKEN=garbage"}, "mcp", "--stdio", "--nats", s.url, "--log-level", "warn")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "desktop", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("MCP with a garbage token: connecting: %v\n%s", err, stderr.String())
	}
	_, err = cs.ListTools(ctx, nil)
	cs.Close()
	if err == nil || !strings.Contains(err.Error(), "E3223") || !strings.Contains(err.Error(), "it is malformed") {
		t.Errorf("MCP tools/list with a garbage token: %v, want the command line's E3223 refusal", err)
	}
	if cmd.ProcessState == nil {
		t.Error("mcp --stdio still running after the client closed")
	} else if code := cmd.ProcessState.ExitCode(); code != exitRefused {
		t.Errorf("mcp --stdio with a garbage token: exit %d, want %d", code, exitRefused)
	}
}

// TestOperatorToolChangesSurviveRestart: what the operator did to an
// example tool (deprecated one version, removed another) is what serve
// finds at its next start: the examples fill in what is missing and
// replace nothing.
func TestOperatorToolChangesSurviveRestart(t *testing.T) {
	cleanEnv(t)
	dir := t.TempDir()
	url, stop := runServe(t, dir)
	for _, args := range [][]string{
		{"tools", "deprecate", "echo", "1.0.0", "--in-favor-of", "noop"},
		{"tools", "delete", "sleep", "1.0.0"},
	} {
		if r := tg(t, "", append(args, "--nats", url, "--data", dir)...); r.code != exitOK {
			t.Fatalf("%v: exit %d\n%s%s", args, r.code, r.stdout, r.stderr)
		}
	}
	stop()
	url, stop = runServe(t, dir)
	defer stop()
	for _, c := range []struct{ id, want string }{
		{"echo", `"deprecated_in_favor_of": "noop"`},
		{"sleep", `"state": "removed"`},
	} {
		r := tg(t, "", "tools", "get", c.id, "--version", "1.0.0", "--nats", url, "--data", dir)
		if r.code != exitOK || !strings.Contains(r.stdout, c.want) {
			t.Errorf("tools get %s after a restart: exit %d, want %s in\n%s%s", c.id, r.code, c.want, r.stdout, r.stderr)
		}
	}
}
