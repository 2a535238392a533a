package bench

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
)

// TestNoopScaling runs the no-op series of the scaling table at a low rate,
// as `make bench` does, with real `toolgate stage` processes: with one and
// with two processes per stage every offered call completes.
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
	bin := buildToolgate(t)
	s, err := measureNoopScaling(ctx, ns.ClientURL(), Options{Rate: 10, Workers: 2, Binary: bin, Dir: t.TempDir()}, cred)
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 2 || s[0].PerStage != 1 || s[1].PerStage != 2 {
		t.Fatalf("series %+v", s)
	}
	for _, x := range s {
		if !strings.Contains(x.Result.Name, "proc per stage") {
			t.Errorf("%s: not run as processes", x.Result.Name)
		}
		if x.Result.Sent == 0 || x.Result.Done != x.Result.Sent {
			t.Errorf("%s: %d of %d calls completed", x.Result.Name, x.Result.Done, x.Result.Sent)
		}
	}
	printScaling(os.Stdout, s)
}

// buildToolgate builds ./cmd/toolgate into a directory of the user's cache
// kept per source tree, so that go build finds it up to date and skips the
// link when nothing changed.
func buildToolgate(t *testing.T) string {
	t.Helper()
	wd, _ := os.Getwd()
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bin := filepath.Join(cache, "toolgate-bench", fmt.Sprintf("%x", sha256.Sum256([]byte(wd)))[:16], "toolgate")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/toolgate/toolgate/cmd/toolgate").CombinedOutput()
	if err != nil {
		t.Fatalf("building toolgate: %v\n%s", err, out)
	}
	return bin
}
