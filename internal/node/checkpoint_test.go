package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/topology"
)

// testClock is the time checkpoints are stamped and expired by; the test
// moves it forward.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestNamedCheckpointResumedADayLater: a cli tool saves a micro and a
// named checkpoint through its control lines and fails; the async answer
// lists both and names the last as its checkpoint_ref. A day later (the
// clock moved on) the micro checkpoint has expired (E3707) while the
// named one starts a new call from its state, by id; a checkpoint of
// another tenant or a deleted one is not found (E3702).
func TestNamedCheckpointResumedADayLater(t *testing.T) {
	clock := &testClock{t: time.Now()}
	e, n, _ := sandboxEnv(t, topology.TopologyOptions{CheckpointClock: clock.now})
	registerTools(t, n, `{"id":"test.cli_named","name":"named","version":"1.0.0","description":"saves a named checkpoint, then fails; resumed, finishes","kind":"cli",
	  "cli":{"command":["sh","-c",`+fmt.Sprintf("%q", `if [ -n "$TOOLGATE_RESUME" ]; then printf '{"resumed":%s}\n' "$(cat "$TOOLGATE_RESUME")"; exit 0; fi
echo 'toolgate:checkpoint {"next":1}'
echo 'toolgate:checkpoint.named before-upload {"next":2, "files":["a","b"]}'
echo "upload failed" >&2
exit 3`)+`],"stdin":"none"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"}}`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const tenant = "named"
	req := request(tenant, "test.cli_named", `{}`)
	req.ExecutionOptions = &api.ExecutionOptions{AsyncMode: true}
	first := e.invoke(req)
	md := first.ExecutionMetadata
	if first.Status != api.StatusError || md == nil || len(md.CheckpointsCreated) != 2 ||
		md.CheckpointsCreated[0].Kind != api.CheckpointMicro || md.CheckpointsCreated[1].Kind != api.CheckpointNamed ||
		first.CheckpointRef != md.CheckpointsCreated[1].ID {
		t.Fatalf("first call: %s", mustJSON(t, first))
	}
	micro, named := md.CheckpointsCreated[0].ID, md.CheckpointsCreated[1].ID

	clock.add(24 * time.Hour)
	list, err := e.client.Checkpoints(ctx, tenant, first.InvocationID)
	if err != nil || len(list) != 2 || !list[0].Expired || list[1].Expired || list[1].Name != "before-upload" || list[1].Parent != micro {
		t.Fatalf("listed a day later: %s, %v", mustJSON(t, list), err)
	}
	resume := func(tenant, id string) api.Response {
		r := request(tenant, "test.cli_named", `{}`)
		r.CheckpointConfig = &api.CheckpointConfig{ResumeFromCheckpointID: id}
		return e.invoke(r)
	}
	if resp := resume(tenant, micro); resp.Error == nil || resp.Error.ECode != api.ECheckpointExpired {
		t.Fatalf("resuming the micro checkpoint a day later: %s", mustJSON(t, resp))
	}
	resp := resume(tenant, named)
	var out struct {
		Resumed struct {
			Next  int      `json:"next"`
			Files []string `json:"files"`
		} `json:"resumed"`
	}
	if err := json.Unmarshal(resp.Result, &out); resp.Status != api.StatusSuccess || err != nil || out.Resumed.Next != 2 ||
		len(out.Resumed.Files) != 2 || resp.ExecutionMetadata.ResumedFromCheckpointID != named {
		t.Fatalf("resuming the named checkpoint a day later: %s", mustJSON(t, resp))
	}
	if resp := resume("other", named); resp.Error == nil || resp.Error.ECode != api.ECheckpointNotFound {
		t.Fatalf("another tenant resuming it: %s", mustJSON(t, resp))
	}
	shown, err := e.client.Checkpoint(ctx, tenant, named, true)
	if err != nil || string(shown.State) != `{"next":2,"files":["a","b"]}` || shown.Kind != api.CheckpointNamed {
		t.Fatalf("show: %s, %v", mustJSON(t, shown), err)
	}
	if _, err := e.client.DeleteCheckpoint(ctx, tenant, named); err != nil {
		t.Fatal(err)
	}
	if resp := resume(tenant, named); resp.Error == nil || resp.Error.ECode != api.ECheckpointNotFound {
		t.Fatalf("resuming a deleted checkpoint: %s", mustJSON(t, resp))
	}
	if _, err := e.client.Checkpoint(ctx, tenant, named, false); !errorHasCode(err, api.ECheckpointNotFound) {
		t.Fatalf("showing a deleted checkpoint: %v", err)
	}
}

func errorHasCode(err error, ecode string) bool {
	var e *api.Error
	return errors.As(err, &e) && e.ECode == ecode
}
