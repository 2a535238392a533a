package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/modelrouter/modeltest"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// TestModelSplitResumesFromItsCheckpoint: a model tool reading a long
// document in parts checkpoints after each part it has an answer to. When
// the execute worker dies while the third part is asked, the redelivered
// call sends the provider only the parts from the third on; a call
// cancelled while its second part is asked, resumed by checkpoint id, sends
// only the parts from the second on. Either way the answer covers every
// part.
func TestModelSplitResumesFromItsCheckpoint(t *testing.T) {
	srv := modeltest.New(t, "openai")
	// The dead worker's request hangs until released, and its runner
	// waits for it to stop.
	defer srv.Release()
	e := newEnv(t, topology.TopologyOptions{AckWait: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	store, err := kvstore.Open(ctx, e.js, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// In KV before any execute worker starts, so that its watch loads it.
	if _, err := store.PutModel(ctx, []byte(fmt.Sprintf(`{"name":"tiny","api":"openai","endpoints":[%q],"tier":"small",
	  "context_window":600,"max_output_tokens":100,"price":{"input_per_1k":1,"output_per_1k":1}}`, srv.Base()))); err != nil {
		t.Fatal(err)
	}
	n := e.startPipeline(node.Config{Stages: allBut(subjects.Execute)})
	registerTools(t, n, `{"id":"test.reader","name":"reader","version":"1.0.0","description":"reads a long document in parts","kind":"model",
	  "model":{"models":["tiny"],"truncate":"split"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "permissions":{"network":[{"host":"127.0.0.1"}]},"limits":{"timeout_ms":30000}}`)
	u, _ := url.Parse(srv.URL)
	port, _ := strconv.Atoi(u.Port())
	long := strings.Repeat("A line of a long document to be read in parts. ", 100)
	request := func(tenant string) api.Request {
		c := grant(tenant, "test.reader")
		c.Network = &token.NetworkGrant{AllowedHosts: []string{"127.0.0.1"}, AllowedPorts: []int{port}}
		return withTok(request(tenant, "test.reader",
			fmt.Sprintf(`{"system":"count the lines","messages":[{"role":"user","content":%q}]}`, long)), mint(t, c))
	}
	// sent is the part numbers of the requests the provider received from
	// the from-th on.
	sent := func(from int) []int {
		var out []int
		for _, req := range srv.Requests()[from:] {
			msgs := req["messages"].([]any)
			c, _ := msgs[len(msgs)-1].(map[string]any)["content"].(string)
			var i, of int
			if _, err := fmt.Sscanf(c, "[Part %d of %d", &i, &of); err != nil {
				t.Fatalf("a request that is not a part: %.80q", c)
			}
			out = append(out, i)
		}
		return out
	}
	type answer struct {
		Content      string `json:"content"`
		Parts        int    `json:"parts"`
		ResumedParts int    `json:"resumed_parts"`
	}
	finished := func(t *testing.T, resp api.Response, resumed int) answer {
		t.Helper()
		var a answer
		if resp.Status != api.StatusSuccess || json.Unmarshal(resp.Result, &a) != nil {
			t.Fatalf("resumed call: %s", mustJSON(t, resp))
		}
		if a.Parts < 4 || a.ResumedParts != resumed || strings.Count(a.Content, srv.Answer) != a.Parts {
			t.Fatalf("answer %+v, want every part answered, %d of them before the resume", a, resumed)
		}
		return a
	}
	from := func(first, parts int) []int {
		var out []int
		for i := first; i <= parts; i++ {
			out = append(out, i)
		}
		return out
	}

	t.Run("worker dies", func(t *testing.T) {
		const tenant = "split-crash"
		doomed := e.runStage(subjects.Execute, nil, 1, 0)
		srv.HangOn(3)
		id, err := e.client.Invoke(ctx, request(tenant), client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "the third part to be asked", func() bool { return srv.Calls() == 3 })
		rec, err := e.client.Status(ctx, tenant, id)
		if err != nil || rec.Status != api.StatusRunning || rec.Checkpoint == nil || rec.Checkpoint.Seq != 2 || rec.Checkpoint.Kind != api.CheckpointMicro {
			t.Fatalf("status while the third part is asked: %s, %v", mustJSON(t, rec), err)
		}
		doomed.Close() // no ack: the call is redelivered after AckWait
		e.runStage(subjects.Execute, nil, 1, 0)
		resp, err := e.client.Wait(ctx, tenant, id)
		if err != nil {
			t.Fatal(err)
		}
		a := finished(t, resp, 2)
		if got := sent(3); fmt.Sprint(got) != fmt.Sprint(from(3, a.Parts)) {
			t.Fatalf("after the worker died the provider was asked parts %v, want %v", got, from(3, a.Parts))
		}
		if resp.ExecutionMetadata.ResumedFromCheckpoint != 2 {
			t.Fatalf("metadata %s", mustJSON(t, resp.ExecutionMetadata))
		}
	})

	t.Run("cancelled, resumed by id", func(t *testing.T) {
		const tenant = "split-cancel"
		start := len(srv.Requests())
		srv.HangOn(int64(start + 2))
		id, err := e.client.Invoke(ctx, request(tenant), client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "the second part to be asked", func() bool { return srv.Calls() == int64(start+2) })
		if _, err := e.client.Cancel(ctx, tenant, id, ""); err != nil {
			t.Fatal(err)
		}
		resp, err := e.client.Wait(ctx, tenant, id)
		if err != nil || resp.Status != api.StatusCancelled || resp.ExecutionMetadata == nil || len(resp.ExecutionMetadata.CheckpointsCreated) != 1 {
			t.Fatalf("cancelled call: %s, %v", mustJSON(t, resp), err)
		}
		again := request(tenant)
		again.CheckpointConfig = &api.CheckpointConfig{ResumeFromCheckpointID: resp.ExecutionMetadata.CheckpointsCreated[0].ID}
		resumed := e.invoke(again)
		a := finished(t, resumed, 1)
		if got := sent(start + 2); fmt.Sprint(got) != fmt.Sprint(from(2, a.Parts)) {
			t.Fatalf("resumed by id, the provider was asked parts %v, want %v", got, from(2, a.Parts))
		}
	})
}
