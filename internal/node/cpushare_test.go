package node_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/topology"
)

var cpuTools = []string{
	`{"id":"cpu.cli","name":"cli","version":"1.0.0","description":"prints {}","kind":"cli",
	  "cli":{"command":["sh","-c","echo '{}'"],"stdin":"none"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},"limits":{"cpu_millicores":200}}`,
	`{"id":"cpu.silent","name":"cli","version":"1.0.0","description":"prints {}","kind":"cli",
	  "cli":{"command":["sh","-c","echo '{}'"],"stdin":"none"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"}}`,
	`{"id":"cpu.builtin","name":"builtin","version":"1.0.0","description":"no-op","kind":"builtin","builtin":{"function":"noop"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},"limits":{"cpu_millicores":200}}`,
}

func cpuWarning(r api.Response) string {
	if r.ExecutionMetadata == nil {
		return ""
	}
	for _, w := range r.ExecutionMetadata.Warnings {
		if strings.HasPrefix(w, api.ECPUShareNotApplied) {
			return w
		}
	}
	return ""
}

// TestCPUShareWarned: a call whose tool asks for a CPU share that is not
// applied says so in its result (E3110), naming why: on a host that
// delegates no cgroup (forced here by configuration), and for a builtin,
// which runs no process of its own. Where the host delegates one (this
// one does, cgroup v1), a cli tool's share is applied and nothing warns.
func TestCPUShareWarned(t *testing.T) {
	if err := sandbox.Available(); err != nil {
		t.Fatalf("this test needs bubblewrap and prlimit: %v", err)
	}
	root := t.TempDir()
	_ = os.Chmod(root, 0o755)
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{Stage: node.StageConfig{Sandbox: sandbox.Config{FileRoot: root,
		CPUErr: errors.New("no cgroup delegated (forced by the test)")}}})
	registerTools(t, n, cpuTools...)
	r := e.invoke(request("cpu", "cpu.cli", `{}`))
	if r.Status != api.StatusSuccess || !strings.Contains(cpuWarning(r), "200 millicores") || !strings.Contains(cpuWarning(r), "forced by the test") {
		t.Fatalf("cli without a cgroup: %s warnings %s", r.Status, mustJSON(t, r.ExecutionMetadata))
	}
	// The default share of a silent manifest warns nobody.
	if r := e.invoke(request("cpu", "cpu.silent", `{}`)); r.Status != api.StatusSuccess || cpuWarning(r) != "" {
		t.Fatalf("silent cli: %s %s", r.Status, mustJSON(t, r.ExecutionMetadata))
	}
	r = e.invoke(request("cpu", "cpu.builtin", `{}`))
	if r.Status != api.StatusSuccess || !strings.Contains(cpuWarning(r), "builtin tools run no process") {
		t.Fatalf("builtin: %s %s", r.Status, mustJSON(t, r.ExecutionMetadata))
	}
	// A request narrowing the share of a silent manifest asks for one too.
	req := request("cpu", "cpu.silent", `{}`)
	req.ResourceLimits = &api.ResourceLimits{CPUMillicoreLimit: 100}
	if r := e.invoke(req); !strings.Contains(cpuWarning(r), "100 millicores") {
		t.Fatalf("narrowed by the request: %s", mustJSON(t, r.ExecutionMetadata))
	}

	if _, err := sandbox.DetectCPU(); err != nil {
		t.Skipf("this host delegates no cgroup, the applied path is not tested here: %v", err)
	}
	e2, n2, _ := sandboxEnv(t, topology.TopologyOptions{})
	registerTools(t, n2, cpuTools...)
	if r := e2.invoke(request("cpu", "cpu.cli", `{}`)); r.Status != api.StatusSuccess || cpuWarning(r) != "" {
		t.Fatalf("cli with a cgroup: %s %s", r.Status, mustJSON(t, r.ExecutionMetadata))
	}
}
