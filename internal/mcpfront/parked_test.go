package mcpfront_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/mcpfront"
	"github.com/toolgate/toolgate/internal/token"
)

// TestParkedCallAnsweredAtOnce: a call that waits for approval is answered
// within seconds (no client request timeout can cancel it then), stays
// parked, is approved, and toolgate_status gives its result to its own
// agent only.
func TestParkedCallAnsweredAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var err error
	if e.front, err = mcpfront.Start(ctx, mcpfront.Config{Bus: busOf(t, e), Verifier: verifier(), Log: quiet(),
		StatusInterval: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	tok := mint(t, token.Claims{})
	other := mint(t, token.Claims{AgentDID: "did:agent:someone-else"})
	status := func(t *testing.T, cs *mcp.ClientSession, id string, wait int) *mcp.CallToolResult {
		t.Helper()
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		defer ccancel()
		r, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: mcpfront.StatusTool,
			Arguments: map[string]any{"invocation_id": id, "wait_seconds": wait}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			cs := e.connect(tr, tok, nil)
			// A client that gives up after 5 s, as the TypeScript SDK does
			// after 60 s.
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			defer ccancel()
			r, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: "t.risky", Arguments: map[string]any{}})
			if err != nil {
				t.Fatalf("the parked call was not answered in time: %v", err)
			}
			id := invocationOf(r)
			if r.IsError || id == "" || !strings.Contains(text(r), "waits for a person's approval") ||
				!strings.Contains(text(r), mcpfront.StatusTool) || !strings.Contains(text(r), id) {
				t.Fatalf("answer of the parked call: %+v %s", r, text(r))
			}
			// Still parked after its request ended.
			if p := status(t, cs, id, 0); p.IsError || !strings.Contains(text(p), string(api.StatusPendingApproval)) {
				t.Fatalf("status while parked: %s", text(p))
			}
			// Another agent of the tenant learns nothing of it.
			if p := status(t, e.connect(tr, other, nil), id, 0); !p.IsError || toolgateError(t, p).ECode != api.EInvocationNotFound {
				t.Fatalf("another agent's status: %s", text(p))
			}
			if _, err := e.client.Decide(ctx, api.ApprovalDecision{Tenant: tenant, InvocationID: id, Approve: true,
				DecidedBy: "did:user:reviewer", Reason: "test"}); err != nil {
				t.Fatal(err)
			}
			done := status(t, cs, id, 20)
			if done.IsError || invocationOf(done) != id || strings.Contains(text(done), "has not ended") {
				t.Fatalf("status after the approval: %+v %s", done, text(done))
			}
			if ev := e.audited(id); ev["status"] != string(api.StatusSuccess) {
				t.Errorf("audit of the approved call: %v", ev)
			}
		})
	}
}
