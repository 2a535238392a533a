package node_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
)

// TestMicroCheckpointsByDefault: a cli tool reports its state twelve times
// over about 1.2 s and no call asks for checkpoints. With the deployment's
// interval (here 300 ms, 30 s in serve) its state is stored every interval,
// not every time; a tool whose manifest sets interval 0 has each state
// stored; one that opts out has none.
func TestMicroCheckpointsByDefault(t *testing.T) {
	e, n, _ := sandboxEnvWith(t, topology.TopologyOptions{}, node.StageConfig{MicroCheckpointInterval: 300 * time.Millisecond})
	script := fmt.Sprintf("%q", `i=0; while [ $i -lt 12 ]; do i=$((i+1)); echo "toolgate:checkpoint {\"step\":$i}"; sleep 0.1; done; echo '{}'`)
	tool := func(id, checkpointing string) string {
		return `{"id":"` + id + `","name":"steps","version":"1.0.0","description":"reports its state as it goes","kind":"cli",
		  "cli":{"command":["sh","-c",` + script + `],"stdin":"none"},` + checkpointing + `
		  "input_schema":{"type":"object"},"output_schema":{"type":"object"},"limits":{"timeout_ms":20000}}`
	}
	registerTools(t, n,
		tool("test.micro_default", ""),
		tool("test.micro_every", `"checkpointing":{"micro_checkpoints":{"interval_seconds":0}},`),
		tool("test.micro_off", `"checkpointing":{"micro_checkpoints":{"enabled":false}},`))
	micro := func(tool string) int {
		t.Helper()
		r := e.invoke(request("micro", tool, `{}`))
		if r.Status != api.StatusSuccess || r.ExecutionMetadata == nil {
			t.Fatalf("%s: %s", tool, mustJSON(t, r))
		}
		n := 0
		for _, c := range r.ExecutionMetadata.CheckpointsCreated {
			if c.Kind == api.CheckpointMicro {
				n++
			}
		}
		return n
	}
	if got := micro("test.micro_default"); got < 2 || got > 8 {
		t.Errorf("by default: %d micro checkpoints of 12 states over 1.2 s, want one every 300 ms", got)
	}
	if got := micro("test.micro_every"); got != 12 {
		t.Errorf("interval 0 in the manifest: %d micro checkpoints, want all 12", got)
	}
	if got := micro("test.micro_off"); got != 0 {
		t.Errorf("opted out in the manifest: %d micro checkpoints, want none", got)
	}
	// A call that asks for checkpoints gets none of a tool that opted out.
	r := request("micro", "test.micro_off", `{}`)
	on := true
	r.CheckpointConfig = &api.CheckpointConfig{EnableCheckpointing: &on, CheckpointIntervalSeconds: 1}
	if resp := e.invoke(r); len(resp.ExecutionMetadata.CheckpointsCreated) != 0 {
		t.Errorf("a call asking for checkpoints of a tool that opted out: %s", mustJSON(t, resp.ExecutionMetadata.CheckpointsCreated))
	}
}
