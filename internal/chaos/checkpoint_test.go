package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// TestCheckpointResumeAfterSIGKILL: a long cli tool checkpoints each step
// through its control lines; its execute process is killed with SIGKILL
// mid-run, and a second execute process resumes the call from its last
// checkpoint. The tool records every step it runs in a file: no step
// before that checkpoint runs twice.
func TestCheckpointResumeAfterSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	s := singleServer(t)
	h := newHarness(t, []string{s.url()}, 1)
	h.setup()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	// A key of this test's own, so that its token grants the tool.
	k, err := token.GenerateSigningKey(token.AlgEdDSA)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := k.PublicJWKS()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(h.jwks, pub, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := token.Mint(k, token.Claims{ToolID: token.Patterns{"test.cli_steps"}, TenantID: tenant, AgentDID: "did:agent:chaos",
		RegisteredClaims: jwt.RegisteredClaims{Issuer: issuer, Audience: jwt.ClaimStrings{audience},
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}})
	if err != nil {
		t.Fatal(err)
	}
	// The tool runs as an unprivileged user of its own: its ledger of
	// steps lies where that user may write.
	dir, err := os.MkdirTemp("", "toolgate-steps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	steps := filepath.Join(dir, "steps.log")
	if err := os.WriteFile(steps, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(dir, 0o755)
	_ = os.Chmod(steps, 0o666)
	script := `i=0
if [ -n "$TOOLGATE_RESUME" ]; then i=$(tr -dc 0-9 < "$TOOLGATE_RESUME"); fi
start=$i
while [ "$i" -lt 12 ]; do
  sleep 0.4
  echo "$i" >> ` + steps + `
  i=$((i+1))
  echo "toolgate:progress $((i*100/12)) step $i"
  if [ "$i" -eq 6 ]; then echo "toolgate:checkpoint.macro halfway {\"next\":$i}"; else echo "toolgate:checkpoint {\"next\":$i}"; fi
done
printf '{"started_at":%s}\n' "$start"`
	doc := `{"id":"test.cli_steps","name":"steps","version":"1.0.0","description":"twelve steps, a checkpoint after each","kind":"cli",
	  "cli":{"command":["sh","-c",` + strconv.Quote(script) + `],"stdin":"none"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object","required":["started_at"]},"limits":{"timeout_ms":120000},"checkpointing":{"micro_checkpoints":{"interval_seconds":0}}}`
	n, err := node.Open(ctx, s.url(), "checkpoint-setup", topology.TopologyOptions{AckWait: ackWait}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	m, err := n.Store.RegisterTool(ctx, []byte(doc), true)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.WaitForTool(ctx, m.ID, m.Version); err != nil {
		t.Fatal(err)
	}
	for _, st := range subjects.Stages {
		if st != subjects.Execute {
			h.startWorker(st)
		}
	}
	h.startWorker("control")
	doomed := h.startWorker(subjects.Execute)
	h.waitReady(time.Minute)

	c, err := client.New(h.conn())
	if err != nil {
		t.Fatal(err)
	}
	id, err := c.Invoke(ctx, api.Request{ToolID: "test.cli_steps", CapabilityToken: tok, Parameters: json.RawMessage(`{}`),
		AgentContext: api.AgentContext{AgentDID: "did:agent:chaos", TenantID: tenant}}, client.InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		rec, err := c.Status(ctx, tenant, id)
		if err == nil && rec.Checkpoint != nil && rec.Checkpoint.Seq >= 3 {
			break
		}
		if ctx.Err() != nil || rec.Status.Terminal() {
			resp, _ := c.Wait(ctx, tenant, id)
			t.Fatalf("no third checkpoint: %+v %v; %+v %+v", rec, err, resp, resp.Error)
		}
		time.Sleep(50 * time.Millisecond)
	}
	doomed.kill()
	killedAt := time.Now()
	h.startWorker(subjects.Execute)
	resp, err := c.Wait(ctx, tenant, id)
	if err != nil || resp.Status != api.StatusSuccess {
		t.Fatalf("resumed call: %+v, %v", resp, err)
	}
	var out struct {
		StartedAt int `json:"started_at"`
	}
	if err := json.Unmarshal(resp.Result, &out); err != nil || out.StartedAt < 3 {
		t.Fatalf("the second run did not resume from a checkpoint: %s", resp.Result)
	}
	md := resp.ExecutionMetadata
	if md.ResumedFromCheckpointID != fmt.Sprintf("cp-%d-%s", out.StartedAt, id) || len(md.CheckpointsCreated) != 12-out.StartedAt {
		t.Fatalf("metadata: resumed from %q, created %+v", md.ResumedFromCheckpointID, md.CheckpointsCreated)
	}
	b, err := os.ReadFile(steps)
	if err != nil {
		t.Fatal(err)
	}
	ran := map[int]int{}
	for _, l := range strings.Fields(string(b)) {
		i, _ := strconv.Atoi(l)
		ran[i]++
	}
	for i := range 12 {
		switch {
		case i < out.StartedAt && ran[i] != 1:
			t.Fatalf("step %d, before the checkpoint resumed from (%d), ran %d times: %v", i, out.StartedAt, ran[i], ran)
		case ran[i] < 1 || ran[i] > 2:
			t.Fatalf("step %d ran %d times: %v", i, ran[i], ran)
		}
	}
	list, err := c.Checkpoints(ctx, tenant, id)
	if err != nil || len(list) != 12 {
		t.Fatalf("%d checkpoints listed, want 12: %v", len(list), err)
	}
	macros := 0
	for _, cp := range list {
		if cp.Kind == api.CheckpointMacro && cp.Name == "halfway" {
			macros++
		}
	}
	if macros != 1 {
		t.Fatalf("%d macro checkpoints named halfway, want 1: %+v", macros, list)
	}
	t.Logf("killed after step %d; resumed on another process %v later; steps ran %v", out.StartedAt, time.Since(killedAt).Round(time.Millisecond), ran)
}
