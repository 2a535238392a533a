package bench

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
)

// TestNoopScaling runs the no-op series of the scaling table at a low rate:
// with one and with two runners per stage every offered call completes.
func TestNoopScaling(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the pipeline twice")
	}
	ns, err := node.StartEmbedded(node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, err := node.Open(ctx, ns.ClientURL(), "bench-test", topology.TopologyOptions{}, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	err = n.RegisterExamples(ctx)
	n.Close()
	if err != nil {
		t.Fatal(err)
	}
	cred, err := newCredentials()
	if err != nil {
		t.Fatal(err)
	}
	s, err := measureNoopScaling(ctx, ns.ClientURL(), Options{Rate: 10, Workers: 2}, cred)
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 2 || s[0].PerStage != 1 || s[1].PerStage != 2 {
		t.Fatalf("series %+v", s)
	}
	for _, x := range s {
		if x.Result.Sent == 0 || x.Result.Done != x.Result.Sent {
			t.Errorf("%s: %d of %d calls completed", x.Result.Name, x.Result.Done, x.Result.Sent)
		}
	}
	printScaling(os.Stdout, s)
}
