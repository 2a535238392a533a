package node_test

import (
	"fmt"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/topology"
	"testing"
)

// TestCLITmpfsBounded: /tmp and /work are memory, so each has a size (the
// manifest's tmp_mb, by default its memory limit): a tool writing past it
// fails with E3102 limit tmp_mb, and one writing within it succeeds.
func TestCLITmpfsBounded(t *testing.T) {
	e, n, _ := sandboxEnv(t, topology.TopologyOptions{})
	cases := []struct {
		name, script, limits, want string
	}{
		{"/tmp past memory_mb", `head -c 200000000 /dev/zero > /tmp/big && echo '{}'`,
			`{"timeout_ms":20000,"memory_mb":64,"file_size_mb":1024}`, api.EResourceLimit},
		{"/work past tmp_mb", `head -c 30000000 /dev/zero > a && head -c 30000000 /dev/zero > b && echo '{}'`,
			`{"timeout_ms":20000,"tmp_mb":40}`, api.EResourceLimit},
		{"/tmp within tmp_mb", `head -c 30000000 /dev/zero > /tmp/a && echo '{}'`,
			`{"timeout_ms":20000,"memory_mb":64,"tmp_mb":40}`, ""},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.t = t
			id := fmt.Sprintf("tmpfs.t%d", i)
			registerTools(t, n, cliTool(id, c.script, c.limits, ""))
			resp := e.invoke(request("tmpfs", id, `{"arg":""}`))
			if c.want == "" {
				if resp.Status != api.StatusSuccess {
					t.Fatalf("%s %s", resp.Status, mustJSON(t, resp.Error))
				}
				return
			}
			if resp.Status != api.StatusError || resp.Error == nil || resp.Error.ECode != c.want || resp.Error.Details["limit"] != "tmp_mb" {
				t.Fatalf("got %s %s, want %s limit tmp_mb", resp.Status, mustJSON(t, resp.Error), c.want)
			}
		})
	}
}
