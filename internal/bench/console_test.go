package bench

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/internal/node"
)

// TestConsoleCost runs the console's series of `make bench` with a few
// calls: every call completes with and without the console, the console
// takes in every audit event the trail receives meanwhile, and the live
// view is sent events.
func TestConsoleCost(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the pipeline")
	}
	ns, err := node.StartEmbedded(node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cred, err := newCredentials()
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ready, errc := make(chan struct{}, 1), make(chan error, 1)
	go func() {
		errc <- node.Run(runCtx, node.Config{NATSURL: ns.ClientURL(), Workers: 2, Examples: true,
			Stage: node.StageConfig{Tokens: cred.verifier}, Log: discardLogger(),
			Ready: func(string, *node.Node) { ready <- struct{}{} }})
	}()
	defer func() { stop(); <-errc }()
	select {
	case <-ready:
	case err := <-errc:
		t.Fatal(err)
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	tg, stopTarget, err := pipelineTarget(ctx, nc, cred, 10, false)
	if err != nil {
		t.Fatal(err)
	}
	defer stopTarget()
	const n = 40
	c, err := measureConsole(ctx, ns.ClientURL(), tg, n, 4)
	if err != nil {
		t.Fatal(err)
	}
	if c.Without.Done != n || c.With.Done != n {
		t.Fatalf("%d and %d of %d calls completed without and with the console", c.Without.Done, c.With.Done, n)
	}
	// Two to four audit events a call.
	if c.AuditEvents < 2*n/2 || c.Ingested != c.AuditEvents || c.Streamed == 0 {
		t.Fatalf("the trail received %d events, the console took in %d and streamed %d", c.AuditEvents, c.Ingested, c.Streamed)
	}
	if c.Ratio() <= 0 || c.IngestRatio() <= 0 {
		t.Fatalf("ratios %.2f and %.2f", c.Ratio(), c.IngestRatio())
	}
	c.Print(os.Stdout)
}
