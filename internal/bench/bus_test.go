package bench

import (
	"context"
	"os"
	"testing"

	"github.com/toolgate/toolgate/internal/node"
)

// TestMeasureBus runs the bus comparison: every series completes on both
// servers (an agent's token and a worker's credentials are admitted by the
// callout) and reports its samples.
func TestMeasureBus(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two servers")
	}
	dir := t.TempDir()
	ns, err := node.StartEmbedded(node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	cred, err := newCredentials()
	if err != nil {
		t.Fatal(err)
	}
	costs, err := measureBus(context.Background(), ns.ClientURL(), dir, cred)
	if err != nil {
		t.Fatal(err)
	}
	if len(costs) != 3 {
		t.Fatalf("%d series, want 3", len(costs))
	}
	for _, c := range costs {
		if len(c.Open.Samples) == 0 || len(c.InProcess.Samples) == 0 || len(c.Authn.Samples) == 0 {
			t.Errorf("%s: no samples", c.Name)
		}
	}
	printBus(os.Stdout, costs)
}
