package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/internal/node"
)

// TestFlatnessAndSoak runs the flatness series small: every call spread
// over many tenants and over many registered tools completes, and the
// registered copies are gone afterwards; then a short soak.
func TestFlatnessAndSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the pipeline")
	}
	ns, err := node.StartEmbedded(node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cred, err := newCredentials()
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ready := make(chan *node.Node, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- node.Run(runCtx, node.Config{NATSURL: ns.ClientURL(), Workers: 4, Examples: true,
			Stage: node.StageConfig{Tokens: cred.verifier}, Log: discardLogger(),
			Ready: func(_ string, n *node.Node) { ready <- n }})
	}()
	defer func() { stop(); <-errc }()
	var n *node.Node
	select {
	case n = <-ready:
	case err := <-errc:
		t.Fatal(err)
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const many = 50
	fs, err := measureFlatness(ctx, nc, n, Options{SaturationN: 100}, cred, many)
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 2 {
		t.Fatalf("%d series, want 2", len(fs))
	}
	for _, f := range fs {
		for _, r := range []Result{f.Base, f.Many} {
			if r.Sent != 100 || r.Done != r.Sent {
				t.Errorf("%s / %s: %d of %d calls completed", f.Name, r.Name, r.Done, r.Sent)
			}
		}
	}
	for i := range many {
		if id := fmt.Sprintf("flat.noop%05d", i); n.Registry.Has(id, "1.0.0") {
			t.Errorf("%s is still registered", id)
		}
	}
	printFlatness(os.Stdout, fs)

	// The soak series on the same pipeline, short: every call completes
	// and the resident set is read the promised number of times.
	base, stopBase, err := spreadTarget(nc, cred, 1, []string{"noop"})
	if err != nil {
		t.Fatal(err)
	}
	defer stopBase()
	s, err := base.soak(ctx, 40, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if s.Result.Sent != 80 || s.Result.Done != s.Result.Sent {
		t.Errorf("soak: %d of %d calls completed", s.Result.Done, s.Result.Sent)
	}
	if len(s.RSS) != soakSamples || s.RSS[0] <= 0 {
		t.Errorf("soak: RSS samples %v, want %d", s.RSS, soakSamples)
	}
	s.Print(os.Stdout)
}
