package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// TestBusTwoPersonRule: a tool with safety.approvers 2 runs only once two
// different people approved it, each with their own signed decision. The
// first approval leaves the call parked and is audited as 1 of 2; the same
// person approving again is refused (E3248) and audited; a record in the
// bucket that claims two approvals on one signature is refused at
// authorize (E3249).
func TestBusTwoPersonRule(t *testing.T) {
	s := serveEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	keys, err := busauth.LoadKeys(s.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	alice := issuePerson(t, keys, busauth.RoleApprover, "alice")
	bob := issuePerson(t, keys, busauth.RoleApprover, "bob")
	const tool = "two.person"
	if _, err := s.operator(t).RegisterTool(ctx, []byte(`{"id":"`+tool+`","name":"two person","version":"1.0.0","description":"a test tool",
	  "kind":"builtin","builtin":{"function":"noop"},"input_schema":{"type":"object"},
	  "safety":{"risk_level":"high","requires_approval":true,"approvers":2},"limits":{"timeout_ms":500}}`), false); err != nil {
		t.Fatal(err)
	}
	ojs, err := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	if err != nil {
		t.Fatal(err)
	}
	nc, raw := s.agent(t, 0, "demo")
	ac, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	pending := func(t *testing.T, id string) {
		t.Helper()
		if rec, err := ac.Status(ctx, "demo", id); err != nil || rec.Status != api.StatusPendingApproval {
			t.Fatalf("%s: %s %v, want still pending_approval", id, rec.Status, err)
		}
	}
	park := func(t *testing.T) (string, api.ApprovalDecision) {
		t.Helper()
		id, err := ac.Invoke(ctx, api.Request{ToolID: tool, Parameters: json.RawMessage(`{}`),
			AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}, CapabilityToken: raw}, client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "the call to wait for approval", func() bool {
			rec, err := ac.Status(ctx, "demo", id)
			return err == nil && rec.Status == api.StatusPendingApproval
		})
		sum, err := alice.client(t, s, nil).Approval(ctx, "demo", id)
		if err != nil {
			t.Fatal(err)
		}
		if sum.Required != 2 {
			t.Fatalf("the approval shows %d approvals required, want 2", sum.Required)
		}
		return id, api.ApprovalDecision{Tenant: "demo", InvocationID: id, Approve: true, RequestDigest: sum.RequestDigest}
	}
	granted := subjects.AuditEvent("demo", envelope.SubjectSuffix(api.TypeApprovalGranted))
	refusedAt := subjects.AuditEvent(subjects.SystemTenant, envelope.SubjectSuffix(api.TypeAdminRefused))

	t.Run("two different approvers", func(t *testing.T) {
		id, d := park(t)
		a, err := alice.client(t, s, nil).DecideSigned(ctx, d, alice.sign)
		if err != nil {
			t.Fatal(err)
		}
		if a.State != api.ApprovalPending || len(a.Approvals) != 1 || a.Approvals[0].DecidedBy != "approver:alice" {
			t.Fatalf("after alice's approval: state %s, approvals %+v; want pending with alice's", a.State, a.Approvals)
		}
		lastEvent(t, ojs, granted, func(e map[string]any) bool {
			return e["invocation_id"] == id && e["approvals"] == 1.0 && e["approvals_required"] == 2.0 && e["decided_by"] == "approver:alice"
		})
		time.Sleep(500 * time.Millisecond) // a wrongly resumed call would have moved on by now
		pending(t, id)

		_, err = alice.client(t, s, nil).DecideSigned(ctx, d, alice.sign)
		if !errors.Is(err, &api.Error{Code: api.StateConflict, ECode: api.EApprovalSamePerson}) {
			t.Fatalf("alice approving again: %v, want E3248", err)
		}
		lastEvent(t, ojs, refusedAt, func(e map[string]any) bool {
			det, _ := e["details"].(map[string]any)
			return e["action"] == subjects.SvcApproval && det["code"] == api.EApprovalSamePerson && e["by"] == "approver:alice"
		})
		pending(t, id)

		a, err = bob.client(t, s, nil).DecideSigned(ctx, d, bob.sign)
		if err != nil {
			t.Fatal(err)
		}
		if a.State != api.ApprovalApproved || a.DecidedBy != "approver:bob" {
			t.Fatalf("after bob's approval: %s by %s, want approved by approver:bob", a.State, a.DecidedBy)
		}
		eventually(t, 20*time.Second, "the approved call to succeed", func() bool {
			rec, err := ac.Status(ctx, "demo", id)
			return err == nil && rec.Status == api.StatusSuccess
		})
		both := func(v any) bool {
			l, _ := v.([]any)
			return len(l) == 2 && slices.Contains(l, any("approver:alice")) && slices.Contains(l, any("approver:bob"))
		}
		lastEvent(t, ojs, granted, func(e map[string]any) bool {
			return e["invocation_id"] == id && e["approvals"] == 2.0 && both(e["approvers"])
		})
		done := subjects.AuditEvent("demo", envelope.SubjectSuffix(api.TypeSucceeded))
		lastEvent(t, ojs, done, func(e map[string]any) bool { return e["invocation_id"] == id && both(e["approvers"]) })
	})

	t.Run("a denial by anyone ends it", func(t *testing.T) {
		id, d := park(t)
		if _, err := alice.client(t, s, nil).DecideSigned(ctx, d, alice.sign); err != nil {
			t.Fatal(err)
		}
		d.Approve = false
		if _, err := bob.client(t, s, nil).DecideSigned(ctx, d, bob.sign); err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "the denied call to end", func() bool {
			rec, err := ac.Status(ctx, "demo", id)
			return err == nil && rec.Status == api.StatusPermissionDenied
		})
	})

	// Control credentials may write the approvals bucket: a record that
	// names a second approver but carries only the first one's signature
	// is no second approval.
	t.Run("two approvals on one signature", func(t *testing.T) {
		id, d := park(t)
		if _, err := alice.client(t, s, nil).DecideSigned(ctx, d, alice.sign); err != nil {
			t.Fatal(err)
		}
		cjs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleControl)))
		kv, err := cjs.KeyValue(ctx, subjects.BucketApprovals)
		if err != nil {
			t.Fatal(err)
		}
		key := "demo." + subjects.Token(id)
		e, err := kv.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		var a kvstore.Approval
		if err := json.Unmarshal(e.Value(), &a); err != nil || len(a.Approvals) != 1 {
			t.Fatalf("the parked record: %+v %v, want alice's approval in it", a.Approvals, err)
		}
		first := a.Approvals[0]
		forged := first
		forged.DecidedBy = "approver:bob"
		a.Approvals = append(a.Approvals, forged)
		a.State, a.DecidedBy, a.DecidedAt, a.Proof = kvstore.ApprovalApproved, first.DecidedBy, first.DecidedAt, first.Proof
		val, _ := json.Marshal(a)
		if _, err := kv.Update(ctx, key, val, e.Revision()); err != nil {
			t.Fatal(err)
		}
		handToAuthorizeAsControl(t, ctx, s, cjs, a.Invocation)
		var rec api.Record
		eventually(t, 20*time.Second, "the call to end", func() bool {
			rec, err = ac.Status(ctx, "demo", id)
			return err == nil && rec.Status.Terminal()
		})
		if rec.Status != api.StatusPermissionDenied || rec.Error == nil || rec.Error.ECode != api.EApprovalsShort {
			t.Fatalf("two approvals on one signature: %s %+v, want permission_denied E3249", rec.Status, rec.Error)
		}
	})
}

// TestBusTwoPersonRuleByRisk: the policy's data asks two different people
// to approve every call of a critical tool
// (approvals.approvers_by_risk), and a critical tool that names no
// safety.approvers of its own is held to it: one approval leaves its call
// parked, the same person again is refused (E3248), a second person's runs
// it.
func TestBusTwoPersonRuleByRisk(t *testing.T) {
	s := serveEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	keys, err := busauth.LoadKeys(s.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	alice := issuePerson(t, keys, busauth.RoleApprover, "alice")
	bob := issuePerson(t, keys, busauth.RoleApprover, "bob")
	op := s.operator(t)
	const tool = "critical.one"
	if _, err := op.RegisterTool(ctx, []byte(`{"id":"`+tool+`","name":"critical","version":"1.0.0","description":"a test tool",
	  "kind":"builtin","builtin":{"function":"noop"},"input_schema":{"type":"object"},
	  "safety":{"risk_level":"critical"},"limits":{"timeout_ms":500}}`), false); err != nil {
		t.Fatal(err)
	}
	if _, err := op.PushPolicy(ctx, map[string]string{"authz.rego": policy.DefaultModule()},
		map[string]any{"approvals": map[string]any{"approvers_by_risk": map[string]any{"critical": 2}}}, ""); err != nil {
		t.Fatal(err)
	}
	nc, raw := s.agent(t, 0, "demo")
	ac, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	status := func(id string) api.Status {
		rec, err := ac.Status(ctx, "demo", id)
		if err != nil {
			return ""
		}
		return rec.Status
	}
	// Parked calls until one is parked under the pushed policy (every
	// worker reloads it on its own).
	var id string
	var d api.ApprovalDecision
	eventually(t, 40*time.Second, "a critical call parked for two approvers", func() bool {
		got, err := ac.Invoke(ctx, api.Request{ToolID: tool, Parameters: json.RawMessage(`{}`),
			AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}, CapabilityToken: raw}, client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "the call to wait for approval", func() bool { return status(got) == api.StatusPendingApproval })
		sum, err := alice.client(t, s, nil).Approval(ctx, "demo", got)
		if err != nil {
			t.Fatal(err)
		}
		id, d = got, api.ApprovalDecision{Tenant: "demo", InvocationID: got, Approve: true, RequestDigest: sum.RequestDigest}
		return sum.Required == 2
	})
	a, err := alice.client(t, s, nil).DecideSigned(ctx, d, alice.sign)
	if err != nil {
		t.Fatal(err)
	}
	if a.State != api.ApprovalPending {
		t.Fatalf("after alice's approval: %s, want still pending", a.State)
	}
	time.Sleep(500 * time.Millisecond) // a wrongly resumed call would have moved on by now
	if st := status(id); st != api.StatusPendingApproval {
		t.Fatalf("after one approval the critical call is %s, want pending_approval", st)
	}
	if _, err := alice.client(t, s, nil).DecideSigned(ctx, d, alice.sign); !errors.Is(err, &api.Error{Code: api.StateConflict, ECode: api.EApprovalSamePerson}) {
		t.Fatalf("alice approving again: %v, want E3248", err)
	}
	if _, err := bob.client(t, s, nil).DecideSigned(ctx, d, bob.sign); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the call approved by two to succeed", func() bool { return status(id) == api.StatusSuccess })
}
