package chaos

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// binDir holds the nats-server and toolgate binaries, built once per test
// run into a directory of the user's cache kept per source tree, so that
// `go build` finds them up to date and skips the link when nothing changed.
var binDir string

func TestMain(m *testing.M) {
	wd, _ := os.Getwd()
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	binDir = filepath.Join(cache, "toolgate-chaos", fmt.Sprintf("%x", sha256.Sum256([]byte(wd)))[:16])
	os.Exit(m.Run())
}

var buildOnce = sync.OnceValue(func() error {
	for _, b := range []struct{ out, pkg string }{
		{"nats-server", "github.com/nats-io/nats-server/v2"},
		{"toolgate", "github.com/toolgate/toolgate/cmd/toolgate"},
	} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, b.out), b.pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s: %v\n%s", b.pkg, err, out)
		}
	}
	return nil
})

func binaries(t *testing.T) {
	t.Helper()
	if err := buildOnce(); err != nil {
		t.Fatal(err)
	}
}

// freePort returns a loopback port nobody listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// serverOpts describes one external nats-server.
type serverOpts struct {
	Name     string
	Port     int // clients
	HTTPPort int // monitoring: /healthz, /jsz
	StoreDir string
	// Cluster, RoutePort and Routes make the server a cluster node; Routes
	// are the URLs it dials (the TCP proxies in front of its peers).
	Cluster   string
	RoutePort int
	Routes    []string
	// SyncAlways fsyncs every write (sync_interval: always).
	SyncAlways bool
}

// serverConfig is the one place the tests write a nats-server configuration.
// When the bus requires authentication, its accounts and auth_callout block
// (deploy/*/auth.conf) are added here, and workers get credentials in
// harness.startWorker.
func serverConfig(o serverOpts) string {
	var b strings.Builder
	fmt.Fprintf(&b, "server_name: %s\nlisten: 127.0.0.1:%d\nhttp: 127.0.0.1:%d\nmax_payload: 8MB\n", o.Name, o.Port, o.HTTPPort)
	sync := ""
	if o.SyncAlways {
		sync = "  sync_interval: always\n"
	}
	fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n%s}\n", o.StoreDir, sync)
	if o.Cluster != "" {
		fmt.Fprintf(&b, "cluster {\n  name: %s\n  listen: 127.0.0.1:%d\n  routes: [\n", o.Cluster, o.RoutePort)
		for _, r := range o.Routes {
			fmt.Fprintf(&b, "    %s\n", r)
		}
		b.WriteString("  ]\n}\n")
	}
	return b.String()
}

// server is one nats-server process, started and killed for real.
type server struct {
	t    *testing.T
	o    serverOpts
	conf string
	log  string
	mu   sync.Mutex
	cmd  *exec.Cmd
}

func newServer(t *testing.T, dir string, o serverOpts) *server {
	conf := filepath.Join(dir, o.Name+".conf")
	if err := os.WriteFile(conf, []byte(serverConfig(o)), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, o: o, conf: conf, log: filepath.Join(dir, o.Name+".log")}
	t.Cleanup(s.kill)
	return s
}

func (s *server) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.o.Port) }

// start runs the server; it does not wait for it (see waitHealthy).
func (s *server) start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(binDir, "nats-server"), "-c", s.conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.cmd = cmd
}

// kill sends SIGKILL and reaps the process.
func (s *server) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	_ = s.cmd.Wait()
	s.cmd = nil
}

// wipe deletes the server's JetStream store (the server must be down).
func (s *server) wipe() {
	if err := os.RemoveAll(s.o.StoreDir); err != nil {
		s.t.Fatal(err)
	}
}

// healthy reports whether /healthz answers 200: the server is up and its
// JetStream assets are current.
func (s *server) healthy() bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", s.o.HTTPPort))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (s *server) waitHealthy(d time.Duration) time.Duration {
	s.t.Helper()
	start := time.Now()
	for !s.healthy() {
		if time.Since(start) > d {
			s.t.Fatalf("%s not healthy after %v; log:\n%s", s.o.Name, d, tailFile(s.log, 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start)
}

// tailFile returns the last n lines of a file.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// worker is one `toolgate stage NAME` process.
type worker struct {
	stage   string
	metrics string // host:port of /metrics, /healthz, /readyz
	log     string
	cmd     *exec.Cmd
	done    chan struct{}
}

// startWorker starts one process of stage against the harness's servers.
func (h *harness) startWorker(stage string) *worker {
	h.t.Helper()
	h.mu.Lock()
	h.seq++
	n := h.seq
	h.mu.Unlock()
	w := &worker{stage: stage, log: filepath.Join(h.dir, fmt.Sprintf("%s-%d.log", stage, n)), done: make(chan struct{}),
		metrics: fmt.Sprintf("127.0.0.1:%d", freePort(h.t))}
	logf, err := os.Create(w.log)
	if err != nil {
		h.t.Fatal(err)
	}
	w.cmd = exec.Command(filepath.Join(binDir, "toolgate"), "stage", stage,
		"--nats", strings.Join(h.urls, ","), "--workers", "2",
		"--jwks", h.jwks, "--token-issuer", issuer, "--token-audience", audience,
		"--file-root", h.root, "--sandbox", "none",
		"--replicas", fmt.Sprint(h.replicas), "--ack-wait", ackWait.String(),
		"--metrics-addr", w.metrics, "--log-level", "warn")
	w.cmd.Stdout, w.cmd.Stderr = logf, logf
	if err := w.cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	go func() {
		_ = w.cmd.Wait()
		logf.Close()
		close(w.done)
	}()
	h.mu.Lock()
	h.workers[stage] = append(h.workers[stage], w)
	h.mu.Unlock()
	return w
}

// ready reports whether the worker's /readyz answers 200.
func (w *worker) ready() bool { return readyz(w.metrics) }

// readyz reports whether the process serving metrics on addr answers its
// /readyz with 200.
func readyz(addr string) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitReady waits until every live worker is ready.
func (h *harness) waitReady(d time.Duration) {
	h.t.Helper()
	h.mu.Lock()
	var ws []*worker
	for _, l := range h.workers {
		ws = append(ws, l...)
	}
	h.mu.Unlock()
	deadline := time.Now().Add(d)
	for _, w := range ws {
		for !w.exited() && !w.ready() {
			if time.Now().After(deadline) {
				h.t.Fatalf("%s not ready after %v; log:\n%s", w.log, d, tailFile(w.log, 20))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (w *worker) kill() {
	_ = w.cmd.Process.Signal(syscall.SIGKILL)
	<-w.done
}

func (w *worker) exited() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// errorLines returns the lines of a worker's log at level ERROR.
func errorLines(path string, max int) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() && len(out) < max {
		if bytes.Contains(sc.Bytes(), []byte("level=ERROR")) {
			out = append(out, sc.Text())
		}
	}
	return out
}
