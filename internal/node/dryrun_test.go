package node_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/subjects"
)

// TestDryRunStopsBeforeTheTool: on the authenticated bus a dry run is
// validated, judged, recorded and routed like a call, then ends with
// success before the tool runs: a cli tool that writes a file leaves none,
// the session's budget is not charged, a tool that needs approval reports
// it without waiting for anyone, and a tool the token may not call is
// refused exactly as a real call is. One terminal audit event says it was
// a dry run.
func TestDryRunStopsBeforeTheTool(t *testing.T) {
	if err := sandbox.Available(); err != nil {
		t.Fatalf("this test needs bubblewrap and prlimit: %v", err)
	}
	root := t.TempDir()
	_ = os.Chmod(filepath.Dir(root), 0o755)
	_ = os.Chmod(root, 0o755)
	if err := os.Mkdir(filepath.Join(root, "data"), 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(filepath.Join(root, "data"), 0o777)
	dir := t.TempDir()
	n, url := runServed(t, node.Config{Embedded: node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: dir},
		Stage: node.StageConfig{Sandbox: sandbox.Config{FileRoot: root}}})
	s := &served{urls: []string{url}, dataDir: dir, node: n}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	op := s.operator(t)
	for _, doc := range []string{
		`{"id":"dry.write","name":"write","version":"1.0.0","description":"writes a file","kind":"cli",
		  "cli":{"command":["sh","-c","echo written > /files/data/out.txt; echo '{}'"],"stdin":"none"},
		  "input_schema":{"type":"object"},"output_schema":{"type":"object"},"cost":{"per_call":0.5},
		  "permissions":{"filesystem":[{"path":"/data","mode":"rw"}]},"safety":{"risk_level":"low"}}`,
		`{"id":"dry.approve","name":"approve","version":"1.0.0","description":"needs a person","kind":"builtin",
		  "builtin":{"function":"noop"},"input_schema":{"type":"object"},"safety":{"risk_level":"low","requires_approval":true,"approvers":2}}`,
		`{"id":"dry.forbidden","name":"forbidden","version":"1.0.0","description":"not granted","kind":"builtin",
		  "builtin":{"function":"noop"},"input_schema":{"type":"object"},"safety":{"risk_level":"low"}}`,
	} {
		m, err := op.RegisterTool(ctx, []byte(doc), false)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.WaitForTool(ctx, m.ToolID, m.Version); err != nil {
			t.Fatal(err)
		}
	}
	const tenant = "demo"
	raw, claims := agentToken(t, tenant, func(c *token.Claims) {
		c.ToolID = token.Patterns{"dry.write", "dry.approve"}
		c.Filesystem = &token.FilesystemGrant{AllowedPaths: []string{"/"}, Mode: "rw"}
		c.Budget = &token.Budget{MaxCalls: 10}
	})
	ac, err := client.New(s.connect(t, 0, nats.Token(raw), nats.CustomInboxPrefix(busauth.InboxPrefix(tenant, claims.ID))))
	if err != nil {
		t.Fatal(err)
	}
	call := func(tool string, dry bool) api.Response {
		t.Helper()
		req := api.Request{ToolID: tool, Parameters: json.RawMessage(`{}`), CapabilityToken: raw,
			AgentContext: api.AgentContext{AgentDID: claims.AgentDID, TenantID: tenant}}
		if dry {
			req.ExecutionOptions = &api.ExecutionOptions{DryRun: true}
		}
		id, err := ac.Invoke(ctx, req, client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := ac.Wait(ctx, tenant, id)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	used := func() int64 {
		t.Helper()
		st, err := ac.Budget(ctx, tenant, token.BudgetKey(claims.ID), api.BudgetLimits{})
		if err != nil {
			t.Fatal(err)
		}
		return st.Used.Calls
	}
	ojs, err := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(root, "data", "out.txt")

	r := call("dry.write", true)
	md := r.ExecutionMetadata
	if r.Status != api.StatusSuccess || md == nil || !md.DryRun || md.DryRunPlan == nil {
		t.Fatalf("a dry run of a cli tool: %s", mustJSON(t, r))
	}
	plan := md.DryRunPlan
	if plan.ApprovalRequired || plan.Route == nil || plan.Route.Executor != "cli" || plan.Route.ToolVersion != "1.0.0" ||
		plan.BudgetCharge == nil || plan.BudgetCharge.Calls != 1 || plan.BudgetCharge.Cost != 0.5 {
		t.Fatalf("the plan: %s", mustJSON(t, plan))
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("the dry run wrote its file: %v", err)
	}
	if u := used(); u != 0 {
		t.Fatalf("the dry run was charged: %d calls used", u)
	}
	ended := lastEvent(t, ojs, subjects.AuditEvent(tenant, envelope.SubjectSuffix(api.TypeSucceeded)), func(d map[string]any) bool {
		return d["invocation_id"] == r.InvocationID
	})
	if emd, _ := ended["execution_metadata"].(map[string]any); emd["dry_run"] != true {
		t.Fatalf("its terminal audit event: %s", mustJSON(t, ended))
	}
	if st, err := ojs.Stream(ctx, subjects.StreamAudit); err != nil {
		t.Fatal(err)
	} else if m, err := st.GetLastMsgForSubject(ctx, subjects.AuditEvent(tenant, envelope.SubjectSuffix(api.TypeInvoked))); err == nil &&
		json.Valid(m.Data) && string(m.Data) != "" {
		var inv struct {
			ID string `json:"invocation_id"`
		}
		_ = json.Unmarshal(m.Data, &inv)
		if inv.ID == r.InvocationID {
			t.Fatal("the dry run announced the tool as started")
		}
	}

	// The same call for real writes the file and is charged: the dry run
	// stopped a call that would have run.
	if r := call("dry.write", false); r.Status != api.StatusSuccess {
		t.Fatalf("the real call: %s", mustJSON(t, r))
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "written\n" {
		t.Fatalf("the real call's file: %q %v", b, err)
	}
	if u := used(); u != 1 {
		t.Fatalf("after the real call: %d calls used, want 1", u)
	}

	r = call("dry.approve", true)
	if r.Status != api.StatusSuccess || r.ExecutionMetadata == nil || r.ExecutionMetadata.DryRunPlan == nil ||
		!r.ExecutionMetadata.DryRunPlan.ApprovalRequired || r.ExecutionMetadata.DryRunPlan.Approvers != 2 {
		t.Fatalf("a dry run of a tool needing approval: %s", mustJSON(t, r))
	}
	if a, err := ac.Approval(ctx, tenant, r.InvocationID); err == nil {
		t.Fatalf("the dry run asked for approval: %s", mustJSON(t, a))
	}

	real, dry := call("dry.forbidden", false), call("dry.forbidden", true)
	if dry.Status != api.StatusPermissionDenied || dry.Error == nil || real.Error == nil || dry.Error.ECode != real.Error.ECode {
		t.Fatalf("a dry run of a tool the token may not call: %s; the real call: %s", mustJSON(t, dry), mustJSON(t, real))
	}
	lastEvent(t, ojs, subjects.AuditEvent(tenant, envelope.SubjectSuffix(api.TypePermissionDenied)), func(d map[string]any) bool {
		return d["invocation_id"] == dry.InvocationID
	})
	if u := used(); u != 1 {
		t.Fatalf("after the dry runs: %d calls used, want 1", u)
	}
}
