package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// burn spins for 1.5 s of wall time and ends by itself, so that the
// kernel's accounting of its processes reaches the sandbox: what it gets of
// the CPU is what its share lets it have.
var burn = []string{"sh", "-c", `end=$(( $(date +%s%N) + 1500000000 )); while [ "$(date +%s%N)" -lt "$end" ]; do i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; done; echo '{}'`}

// TestCPUShareApplied: where the host delegates a cgroup (this one does,
// cgroup v1's cpu controller; the test says so and skips where not), a run
// with a share of 50 millicores spinning for 1.5 s gets about 75 ms of
// CPU, far less than the same run without a share; its cgroup is gone
// afterwards.
func TestCPUShareApplied(t *testing.T) {
	cfg := requireSandbox(t)
	// A run cgroup left by a toolgate that was killed (no such process)
	// is swept when the next one starts.
	if cg, err := DetectCPU(); err == nil {
		stale := filepath.Join(cg.Dir, "run-999999999-1")
		if err := os.Mkdir(stale, 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := DetectCPU(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(stale); err == nil {
			t.Fatalf("the stale %s was not swept", stale)
		}
	}
	cg, err := DetectCPU()
	if err != nil {
		t.Skipf("no cgroup delegated on this host: %v", err)
	}
	t.Logf("cgroup for runs: %s (v2 %v)", cg.Dir, cg.V2)
	run := func(cfg Config, millicores int64) Result {
		t.Helper()
		res, err := Run(context.Background(), cfg, Spec{Argv: burn,
			Limits: Limits{Wall: 20 * time.Second, CPUSeconds: 10, CPUMillicores: millicores}})
		if err != nil {
			t.Fatalf("share %d (cgroup %v): %v; stderr %s", millicores, cfg.CPU != nil, err, res.Stderr)
		}
		return res
	}
	free := run(cfg, 50)
	if free.CPUShare {
		t.Fatal("a share was reported applied without a cgroup")
	}
	cfg.CPU = cg
	held := run(cfg, 50)
	t.Logf("CPU used: %v with 50 millicores, %v without", held.CPU, free.CPU)
	if !held.CPUShare {
		t.Fatal("the share was not applied")
	}
	// 75 ms, plus a period's rounding and the sandbox's own start; the
	// unlimited run on a shared machine gets what the others leave it.
	if held.CPU > 200*time.Millisecond || held.CPU*3 > free.CPU*2 {
		t.Fatalf("with a share of 50 millicores the run used %v of CPU in 1.5 s (without: %v)", held.CPU, free.CPU)
	}
	left, _ := filepath.Glob(filepath.Join(cg.Dir, "run-*"))
	for _, d := range left {
		if _, err := os.Stat(d); err == nil {
			t.Fatalf("the run's cgroup %s was left behind", d)
		}
	}
}
