package node_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/subjects"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func probe(addr, path string) (int, string) {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestHealthAndReadiness: a worker started before its server is alive
// (/healthz 200) and not ready (/readyz 503) while it waits with backoff;
// ready once the topology exists and its stage runs; not ready while the
// server is down; ready again after the server is back.
func TestHealthAndReadiness(t *testing.T) {
	natsAddr, metrics := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- node.Run(ctx, node.Config{NATSURL: "nats://" + natsAddr, Stages: []string{subjects.Validate},
			Workers: 1, MetricsAddr: metrics, Log: quietLog()})
	}()
	stopRun := func() { cancel(); <-done }
	t.Cleanup(func() {
		if ctx.Err() == nil {
			stopRun()
		}
	})

	eventually(t, 10*time.Second, "/healthz to answer", func() bool { code, _ := probe(metrics, "/healthz"); return code == 200 })
	if code, body := probe(metrics, "/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before the server exists: %d %s", code, body)
	}

	dir := t.TempDir()
	start := func() func() {
		ns, err := node.StartEmbedded(node.EmbeddedOptions{Listen: natsAddr, DataDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		return func() { ns.Shutdown(); ns.WaitForShutdown() }
	}
	stop := start()
	eventually(t, 30*time.Second, "/readyz once the server is up", func() bool { code, _ := probe(metrics, "/readyz"); return code == 200 })

	stop()
	eventually(t, 10*time.Second, "/readyz to fail while the server is down", func() bool {
		code, _ := probe(metrics, "/readyz")
		return code == http.StatusServiceUnavailable
	})
	if code, _ := probe(metrics, "/healthz"); code != 200 {
		t.Fatalf("/healthz while the server is down: %d", code)
	}
	stop = start()
	defer stop()
	eventually(t, 30*time.Second, "/readyz after the server is back", func() bool { code, _ := probe(metrics, "/readyz"); return code == 200 })
	if code, body := probe(metrics, "/metrics"); code != 200 || len(body) == 0 {
		t.Fatalf("/metrics: %d", code)
	}
	stopRun()
}

// TestReadinessWatchesStages: a stage that reports it takes no work makes
// the process not ready, with the stage's reason.
func TestReadinessWatchesStages(t *testing.T) {
	nc := natstest.Connect(t, natstest.Server(t).ClientURL())
	var h node.Health
	h.SetReady(nc)
	why := ""
	h.Watch(func() string { return "" }, func() string { return why })
	if got := h.NotReady(); got != "" {
		t.Fatalf("every stage pulls: %s", got)
	}
	why = "stage execute has neither pulled nor settled a message for 1m5s"
	if got := h.NotReady(); got != why {
		t.Fatalf("NotReady = %q, want %q", got, why)
	}
}
