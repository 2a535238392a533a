package mcptool_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/stages/execute/kind"
	"github.com/toolgate/toolgate/stages/execute/mcptool"
)

// recorder is a run's Progress that records what the tool reported.
type recorder struct {
	mu       sync.Mutex
	resumed  json.RawMessage
	percents []float64
	saved    []string // kind name state
}

func (r *recorder) Report(p float64, _ string) {
	r.mu.Lock()
	r.percents = append(r.percents, p)
	r.mu.Unlock()
}
func (r *recorder) Resumed() json.RawMessage { return r.resumed }
func (r *recorder) Checkpoint(state json.RawMessage) error {
	_, err := r.Save(api.CheckpointMicro, "", state)
	return err
}
func (r *recorder) Save(kind, name string, state json.RawMessage) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.saved = append(r.saved, fmt.Sprintf("%s %s %s", kind, name, state))
	return fmt.Sprintf("cp-%d-x", len(r.saved)), nil
}

// TestMCPCheckpoints: an MCP tool checkpoints through progress
// notifications whose message is a control line, reports progress through
// the others, and finds a resumed run's state in the call's _meta; a bad
// checkpoint line fails the call with E3701. Notifications arrive apart
// from the result, so only those that arrived before it count.
func TestMCPCheckpoints(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "steps", Version: "1.0.0"}, nil)
	type in struct {
		Bad bool `json:"bad,omitempty"`
	}
	type out struct {
		StartedAt int `json:"started_at"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "steps", Description: "four steps"}, func(ctx context.Context, req *mcp.CallToolRequest, a in) (*mcp.CallToolResult, out, error) {
		start := 0
		if r, ok := req.Params.Meta[mcptool.ResumeMeta].(map[string]any); ok {
			start = int(r["next"].(float64))
		}
		tok := req.Params.GetProgressToken()
		note := func(p float64, msg string) {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: p, Total: 4, Message: msg})
		}
		for i := start; i < 4; i++ {
			note(float64(i+1), fmt.Sprintf("step %d", i+1))
			note(float64(i+1), fmt.Sprintf(`toolgate:checkpoint {"next":%d}`, i+1))
			if i == 1 {
				note(float64(i+1), `toolgate:checkpoint.named two {"next":2}`)
			}
		}
		if a.Bad {
			note(4, `toolgate:checkpoint.named {"no":"name"}`)
		}
		// Notifications reach the client apart from the result: a long
		// tool's come well before it, as these do after a pause.
		time.Sleep(100 * time.Millisecond)
		return nil, out{StartedAt: start}, nil
	})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	defer srv.Close()
	k := mcptool.New(mcptool.Config{})
	t.Cleanup(func() { _ = k.Close() })
	spec := mcptool.Spec{Server: "steps", Tool: "steps", URL: srv.URL + "/mcp"}
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	m := manifest(t, "steps", spec, fmt.Sprintf(`,"permissions":{"network":[{"host":"127.0.0.1","port":%d}]}`, port))
	fn := prepare(t, k, m, envelope.Grants{Hosts: []string{"127.0.0.1"}})

	run := func(r *recorder, params string) (json.RawMessage, error) {
		return fn(kind.WithProgress(t.Context(), r), json.RawMessage(params))
	}
	first := &recorder{}
	res, err := run(first, `{}`)
	if err != nil || string(res) != `{"started_at":0}` {
		t.Fatalf("first run: %s %v", res, err)
	}
	want := []string{`micro  {"next":1}`, `micro  {"next":2}`, `named two {"next":2}`, `micro  {"next":3}`, `micro  {"next":4}`}
	if fmt.Sprint(first.saved) != fmt.Sprint(want) || len(first.percents) != 4 || first.percents[3] != 100 {
		t.Fatalf("first run saved %q, reported %v", first.saved, first.percents)
	}
	resumed := &recorder{resumed: json.RawMessage(`{"next":3}`)}
	res, err = run(resumed, `{}`)
	if err != nil || string(res) != `{"started_at":3}` || len(resumed.saved) != 1 {
		t.Fatalf("resumed run: %s %v, saved %q", res, err, resumed.saved)
	}
	_, err = run(&recorder{}, `{"bad":true}`)
	wantECode(t, err, api.ECheckpointCreate)
}
