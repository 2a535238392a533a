// Package docs holds the user documentation. Its test runs every command
// block of README.md and docs/*.md against a real toolgate, so the pages
// cannot drift from the product.
//
// A block fenced as ```sh is run with bash (-e, pipefail) in a working
// directory holding a copy of README.md, the data directory of a running
// `toolgate serve --examples` (./toolgate-data) and a link to .cache, with
// the freshly built toolgate first on PATH. As a user's, the blocks run
// outside the repository with NATS_URL unset: serve listens on the default
// nats://127.0.0.1:4222, and nats contexts live in a directory of the test's.
// Blocks of one file run in order, so a later block may use what an earlier
// one created. A block fenced as ```sh no-run is illustrative (it needs an
// external server, a real key, …) and is only shown.
//
// The SIEM of docs/audit.md is there too: serve sends its audit events
// (--audit-otlp) to an OTLP/HTTP receiver the test runs, which writes what
// it takes to ./otlp-logs.jsonl as an OpenTelemetry collector's file
// exporter does (OTLP JSON, one request a line).
package docs

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
)

// block is one runnable command block.
type block struct {
	file string
	line int
	body string
}

// blocks returns the ```sh blocks of path not marked no-run.
func blocks(t *testing.T, path string) []block {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []block
	var cur *block
	var skip bool
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			info := strings.Fields(strings.TrimPrefix(trimmed, "```"))
			if len(info) > 0 && info[0] == "sh" {
				cur = &block{file: filepath.Base(path), line: n}
				skip = len(info) > 1 && info[1] == "no-run"
			} else if len(info) > 0 || trimmed == "```" {
				cur = &block{line: -1} // another language: skip to its end
			}
		case cur != nil && trimmed == "```":
			if cur.line > 0 && !skip {
				out = append(out, *cur)
			}
			cur = nil
		case cur != nil:
			cur.body += line + "\n"
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestCommandBlocks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts toolgate and runs the documentation's commands")
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files := []string{filepath.Join(repo, "README.md")}
	more, _ := filepath.Glob(filepath.Join(repo, "docs", "*.md"))
	files = append(files, more...)

	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "toolgate"), "./cmd/toolgate")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// The nats CLI: from PATH, or where `make nats` puts it.
	path := bin + string(os.PathListSeparator) + filepath.Join(repo, ".cache", "bin") +
		string(os.PathListSeparator) + os.Getenv("PATH")
	_, natsErr := exec.LookPath("nats")
	if natsErr != nil {
		if _, err := os.Stat(filepath.Join(repo, ".cache", "bin", "nats")); err == nil {
			natsErr = nil
		}
	}

	work := t.TempDir()
	// Sandboxed runs have uids of their own: like a real deployment's, the
	// directories they are granted must let other users in.
	for _, d := range []string{work, filepath.Dir(work)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	readme, err := os.ReadFile(filepath.Join(repo, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "README.md"), readme, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(repo, ".cache"), filepath.Join(work, ".cache")); err != nil {
		t.Fatal(err)
	}
	// The file root make run serves, apart from the data directory.
	if err := os.CopyFS(filepath.Join(work, "examples", "files"), os.DirFS(filepath.Join(repo, "examples", "files"))); err != nil {
		t.Fatal(err)
	}
	// As a user runs them: no NATS_URL, so every command reaches the
	// default server, which serve is; nats contexts in a directory of the
	// test's own.
	natsURL := holdDefaultPort(t)
	env := []string{"PATH=" + path, "TOOLGATE_TOKEN=", "XDG_CONFIG_HOME=" + t.TempDir()}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, "NATS_") && k != "PATH" && k != "TOOLGATE_TOKEN" && k != "TOOLGATE_TENANT" && k != "XDG_CONFIG_HOME" {
			env = append(env, kv)
		}
	}

	siem := otlpReceiver(t, filepath.Join(work, "otlp-logs.jsonl"))

	ctx, cancel := context.WithCancel(context.Background())
	serve := exec.CommandContext(ctx, filepath.Join(bin, "toolgate"), "serve", "--examples",
		"--data", "toolgate-data", "--listen", strings.TrimPrefix(natsURL, "nats://"), "--file-root", "examples/files", "--mcp-path-roots", ".cache/mcp-servers",
		"--audit-otlp", siem, "--log-level", "warn")
	serve.Dir, serve.Env = work, env
	var serveLog bytes.Buffer
	serve.Stdout, serve.Stderr = &serveLog, &serveLog
	serve.Cancel = func() error { return serve.Process.Signal(os.Interrupt) }
	serve.WaitDelay = 10 * time.Second
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = serve.Wait()
		if t.Failed() {
			t.Logf("toolgate serve output:\n%s", serveLog.String())
		}
	})
	// The operator's credentials, as serve prints them: every connection to
	// the bus is authenticated.
	opJWT := filepath.Join(work, "toolgate-data", "busauth", "operator.jwt")
	ready := time.Now().Add(60 * time.Second)
	for {
		if b, err := os.ReadFile(opJWT); err == nil && !slices.ContainsFunc(env, func(s string) bool { return strings.HasPrefix(s, "NATS_TOKEN=") }) {
			env = append(env, "NATS_NKEY="+filepath.Join(work, "toolgate-data", "busauth", "operator.nk"),
				"NATS_TOKEN="+strings.TrimSpace(string(b)))
		}
		probe := exec.Command(filepath.Join(bin, "toolgate"), "tools", "list")
		probe.Dir, probe.Env = work, env
		_, perr := probe.Output()
		_, terr := os.Stat(filepath.Join(work, "toolgate-data", "dev-token"))
		if perr == nil && terr == nil {
			break
		}
		if time.Now().After(ready) {
			t.Fatalf("toolgate serve did not come up: %v %v\n%s", perr, terr, serveLog.String())
		}
		time.Sleep(200 * time.Millisecond)
	}

	// The pages leave the checkout, and the policy in force, as they
	// found them: a reader's later commands, and the next page's blocks,
	// run against the shipped product.
	checkout := checkoutState(t, repo)
	state := func() string {
		var out strings.Builder
		for _, args := range [][]string{{"policy", "show", "--json"}, {"policy", "shadow", "show", "--json"}} {
			cmd := exec.Command(filepath.Join(bin, "toolgate"), args...)
			cmd.Dir, cmd.Env = work, env
			b, err := cmd.Output()
			var p struct {
				Pushed   bool              `json:"pushed"`
				Revision uint64            `json:"revision"`
				Modules  map[string]string `json:"modules"`
				Data     json.RawMessage   `json:"data"`
			}
			if err == nil {
				err = json.Unmarshal(b, &p)
			}
			if err != nil {
				t.Fatalf("toolgate %s: %v", strings.Join(args, " "), err)
			}
			fmt.Fprintf(&out, "%s: pushed %v, revision %d, modules %v, sha256 %x\n", strings.Join(args[:len(args)-1], " "),
				p.Pushed, p.Revision, slices.Sorted(maps.Keys(p.Modules)), sha256.Sum256(b))
		}
		return out.String()
	}
	policyBefore := state()
	t.Cleanup(func() {
		if t.Failed() {
			return
		}
		if after := state(); after != policyBefore {
			t.Errorf("the documentation's commands left another policy in force than the one they started with:\n--- before\n%s--- after\n%s", policyBefore, after)
		}
		if after := checkoutState(t, repo); after != checkout {
			t.Errorf("the documentation's commands changed the checkout %s (they run in a directory of their own):\n--- before\n%s--- after\n%s", repo, checkout, after)
		}
	})

	for _, file := range files {
		for _, b := range blocks(t, file) {
			t.Run(fmt.Sprintf("%s:%d", b.file, b.line), func(t *testing.T) {
				if natsErr != nil && usesNATSCLI(b.body) {
					t.Skip("the nats CLI is not installed: `make nats` installs it into .cache/bin (.ci/run does)")
				}
				bctx, bcancel := context.WithTimeout(ctx, 60*time.Second)
				defer bcancel()
				cmd := exec.CommandContext(bctx, "bash", "-e", "-o", "pipefail", "-c", b.body)
				cmd.Dir, cmd.Env = work, env
				// A block that hangs is killed with everything it started.
				cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
				cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
				cmd.WaitDelay = 5 * time.Second
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("block at %s:%d failed: %v\n--- block\n%s--- output\n%s", b.file, b.line, err, b.body, out)
				}
			})
		}
	}
}

// checkoutState lists what git sees changed, untracked or ignored in the
// checkout at repo (but its .cache), with each such file's size and modification time, so
// that a file written there, or changed again, shows. Outside a git
// checkout it is empty.
func checkoutState(t *testing.T, repo string) string {
	t.Helper()
	// .cache is left out: the shared tool cache, which other test
	// packages of the same run fill while this one runs.
	cmd := exec.Command("git", "status", "--porcelain=v1", "-z", "--ignored", "--untracked-files=all", "--", ".", ":!.cache")
	cmd.Dir = repo
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	var b strings.Builder
	for _, entry := range strings.Split(string(out), "\x00") {
		if len(entry) < 4 {
			continue
		}
		path := entry[3:]
		fmt.Fprintf(&b, "%s", entry)
		if fi, err := os.Lstat(filepath.Join(repo, path)); err == nil {
			fmt.Fprintf(&b, " %d %s", fi.Size(), fi.ModTime().UTC().Format(time.RFC3339Nano))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// defaultURL is the server toolgate's commands and the nats CLI reach when
// nothing names one.
const defaultURL = "nats://127.0.0.1:4222"

// holdDefaultPort returns defaultURL once its port is free to serve on. Runs
// of this test on one machine take turns (a lock file); a port held by
// something else fails the test, saying what holds it.
func holdDefaultPort(t *testing.T) string {
	t.Helper()
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "toolgate-docs-test.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() }) // closing releases the lock
	addr := strings.TrimPrefix(defaultURL, "nats://")
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		l, err := net.Listen("tcp", addr)
		if err == nil {
			l.Close()
			return defaultURL
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s stays taken (%v): the documentation's commands run as a user's do, against the default server; stop what listens there (a `make run`?)", addr, err)
		}
	}
}

// otlpReceiver runs an OTLP/HTTP logs receiver, as a collector's is: each
// request decoded with the collector's own data library and appended to
// path as OTLP JSON (what the collector's file exporter writes), then
// acknowledged. It returns the URL to send to.
func otlpReceiver(t *testing.T, path string) string {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	handle := func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/logs" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" { // OTEL_EXPORTER_OTLP_COMPRESSION
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		req := plogotlp.NewExportRequest()
		if err == nil {
			err = req.UnmarshalProto(b)
		}
		var line []byte
		if err == nil {
			line, err = (&plog.JSONMarshaler{}).MarshalLogs(req.Logs())
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		_, err = f.Write(append(line, '\n'))
		mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		out, _ := plogotlp.NewExportResponse().MarshalProto()
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(handle), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		_ = srv.Close()
		_ = f.Close()
	})
	return "http://" + l.Addr().String()
}

func usesNATSCLI(body string) bool {
	for _, line := range strings.Split(body, "\n") {
		f := strings.Fields(line)
		for i, w := range f {
			if w == "nats" && (i == 0 || f[i-1] == "|" || f[i-1] == "&&" || strings.HasSuffix(f[i-1], "(")) {
				return true
			}
		}
	}
	return false
}
