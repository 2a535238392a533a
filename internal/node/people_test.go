package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/subjects"
)

// person is a named person's credentials, issued from the deployment's
// keys (or another deployment's) into a temporary folder.
type person struct {
	creds string
	sign  client.Sign
}

func issuePerson(t *testing.T, keys *busauth.Keys, role busauth.Role, name string) person {
	t.Helper()
	b, err := keys.IssueCredentials(role, name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), name+".creds")
	if err := busauth.WriteCredsFiles(p, b); err != nil {
		t.Fatal(err)
	}
	sg, err := busauth.SignerFromCreds(p)
	if err != nil {
		t.Fatal(err)
	}
	return person{creds: p, sign: func(subject string, body []byte) (nats.Header, error) { return sg.Sign(nil, subject, body, time.Now()) }}
}

// client connects as the person and signs with sign (the person's own
// signature when nil).
func (p person) client(t *testing.T, s *served, sign client.Sign) *client.Client {
	t.Helper()
	c, err := client.New(s.connect(t, 0, busauth.CredentialsOption(p.creds)))
	if err != nil {
		t.Fatal(err)
	}
	c.Sign = p.sign
	if sign != nil {
		c.Sign = sign
	}
	return c
}

// lastEvent is the data of the last audit event stored on subject, once
// cond holds for it.
func lastEvent(t *testing.T, js jetstream.JetStream, subject string, cond func(map[string]any) bool) map[string]any {
	t.Helper()
	var data map[string]any
	eventually(t, 20*time.Second, "an audit event on "+subject, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, subjects.StreamAudit)
		if err != nil {
			return false
		}
		m, err := st.GetLastMsgForSubject(ctx, subject)
		if err != nil {
			return false
		}
		var e struct {
			Data map[string]any `json:"data"`
		}
		if json.Unmarshal(m.Data, &e) != nil {
			return false
		}
		data = e.Data
		return cond(data)
	})
	return data
}

// TestBusPeopleRoles: approvers decide, admins change, auditors read, each
// with a credential of their own; the operator's use is break-glass; a
// signed request from a role that may not send it, or from another
// deployment, is refused and audited; and no credential but audit's writes
// the trail.
func TestBusPeopleRoles(t *testing.T) {
	s := serveEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	keys, err := busauth.LoadKeys(s.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	alice := issuePerson(t, keys, busauth.RoleApprover, "alice")
	bob := issuePerson(t, keys, busauth.RoleAdmin, "bob")
	carol := issuePerson(t, keys, busauth.RoleAuditor, "carol")
	other, err := busauth.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	eve := issuePerson(t, other, busauth.RoleApprover, "eve")
	ojs, err := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	if err != nil {
		t.Fatal(err)
	}
	refusedAt := subjects.AuditEvent(subjects.SystemTenant, envelope.SubjectSuffix(api.TypeAdminRefused))
	// refusal waits for the audit of a refused request to subject with code.
	refusal := func(t *testing.T, subject, code, by string) {
		t.Helper()
		lastEvent(t, ojs, refusedAt, func(d map[string]any) bool {
			det, _ := d["details"].(map[string]any)
			return d["action"] == subject && det["code"] == code && (by == "" || d["by"] == by)
		})
	}

	nc, raw := s.agent(t, 0, "demo")
	ac, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	park := func(t *testing.T) (string, api.ApprovalSummary) {
		t.Helper()
		req := api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"needs a person"}`),
			AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}, CapabilityToken: raw,
			ExecutionOptions: &api.ExecutionOptions{RequireApproval: true}}
		id, err := ac.Invoke(ctx, req, client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "the call to wait for approval", func() bool {
			rec, err := ac.Status(ctx, "demo", id)
			return err == nil && rec.Status == api.StatusPendingApproval
		})
		// The approver lists and shows approvals with its own credential.
		sum, err := alice.client(t, s, nil).Approval(ctx, "demo", id)
		if err != nil {
			t.Fatalf("the approver shows the approval: %v", err)
		}
		return id, sum
	}
	decision := func(id string, sum api.ApprovalSummary) api.ApprovalDecision {
		return api.ApprovalDecision{Tenant: "demo", InvocationID: id, Approve: true, DecidedBy: "mallory", RequestDigest: sum.RequestDigest}
	}
	granted := subjects.AuditEvent("demo", envelope.SubjectSuffix(api.TypeApprovalGranted))

	t.Run("an approver decides, recorded by name", func(t *testing.T) {
		id, sum := park(t)
		a, err := alice.client(t, s, nil).DecideSigned(ctx, decision(id, sum), alice.sign)
		if err != nil {
			t.Fatal(err)
		}
		if a.DecidedBy != "approver:alice" {
			t.Fatalf("decided by %q, want approver:alice", a.DecidedBy)
		}
		eventually(t, 20*time.Second, "the approved call to succeed", func() bool {
			rec, err := ac.Status(ctx, "demo", id)
			return err == nil && rec.Status == api.StatusSuccess
		})
		d := lastEvent(t, ojs, granted, func(d map[string]any) bool { return d["invocation_id"] == id })
		if d["decided_by"] != "approver:alice" || d["break_glass"] == true {
			t.Fatalf("the granted event: %v, want decided_by approver:alice and no break_glass", d)
		}
	})

	t.Run("the operator's decision is break-glass", func(t *testing.T) {
		id, sum := park(t)
		if _, err := s.operator(t).DecideSigned(ctx, decision(id, sum), s.signer(t, busauth.RoleOperator)); err != nil {
			t.Fatal(err)
		}
		d := lastEvent(t, ojs, granted, func(d map[string]any) bool { return d["invocation_id"] == id })
		if d["decided_by"] != "operator:local" || d["break_glass"] != true {
			t.Fatalf("the granted event: %v, want decided_by operator:local with break_glass", d)
		}
	})

	t.Run("an auditor's decision is refused and audited", func(t *testing.T) {
		id, sum := park(t)
		// The bus does not carry it from the auditor's connection ...
		if got, err := refused(t, s.connect(t, 0, busauth.CredentialsOption(carol.creds)), false, subjects.SvcApproval); err != nil || !got {
			t.Fatalf("the auditor publishing on %s: refused %v (%v), want refused", subjects.SvcApproval, got, err)
		}
		// ... and the service refuses its signature over any connection.
		_, err := alice.client(t, s, nil).DecideSigned(ctx, decision(id, sum), carol.sign)
		if !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.ERoleNotPermitted}) {
			t.Fatalf("an auditor's decision: %v, want E3245", err)
		}
		refusal(t, subjects.SvcApproval, api.ERoleNotPermitted, "auditor:carol")
		if rec, err := ac.Status(ctx, "demo", id); err != nil || rec.Status != api.StatusPendingApproval {
			t.Fatalf("after the auditor's decision: %s %v, want still pending_approval", rec.Status, err)
		}
	})

	t.Run("an approver of another deployment is refused and audited", func(t *testing.T) {
		id, sum := park(t)
		_, err := alice.client(t, s, nil).DecideSigned(ctx, decision(id, sum), eve.sign)
		if !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.EDeciderUnverified}) {
			t.Fatalf("another deployment's approver: %v, want E3217", err)
		}
		refusal(t, subjects.SvcApproval, api.EDeciderUnverified, "")
	})

	t.Run("an admin signs no decision", func(t *testing.T) {
		id, sum := park(t)
		_, err := alice.client(t, s, nil).DecideSigned(ctx, decision(id, sum), bob.sign)
		if !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.ERoleNotPermitted}) {
			t.Fatalf("an admin's decision: %v, want E3245", err)
		}
		refusal(t, subjects.SvcApproval, api.ERoleNotPermitted, "admin:bob")
	})

	modules := map[string]string{"authz.rego": policy.DefaultModule()}
	pushed := subjects.AuditEvent(subjects.SystemTenant, envelope.SubjectSuffix(api.TypePolicyPushed))
	t.Run("an approver pushes no policy", func(t *testing.T) {
		if got, err := refused(t, s.connect(t, 0, busauth.CredentialsOption(alice.creds)), false, subjects.SvcPolicyPush); err != nil || !got {
			t.Fatalf("the approver publishing on %s: refused %v (%v), want refused", subjects.SvcPolicyPush, got, err)
		}
		_, err := bob.client(t, s, alice.sign).PushPolicy(ctx, modules, nil, "")
		if !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.ERoleNotPermitted}) {
			t.Fatalf("an approver's policy push: %v, want E3245", err)
		}
		refusal(t, subjects.SvcPolicyPush, api.ERoleNotPermitted, "approver:alice")
	})

	t.Run("an admin pushes policy, recorded by name; the operator's push is break-glass", func(t *testing.T) {
		r, err := bob.client(t, s, nil).PushPolicy(ctx, modules, nil, "")
		if err != nil {
			t.Fatal(err)
		}
		if r.PushedBy != "admin:bob" {
			t.Fatalf("pushed by %q, want admin:bob", r.PushedBy)
		}
		d := lastEvent(t, ojs, pushed, func(d map[string]any) bool { return d["by"] == "admin:bob" })
		if d["break_glass"] == true {
			t.Fatalf("an admin's push flagged break-glass: %v", d)
		}
		if _, err := s.operator(t).PushPolicy(ctx, modules, nil, ""); err != nil {
			t.Fatal(err)
		}
		lastEvent(t, ojs, pushed, func(d map[string]any) bool { return d["by"] == "operator:local" && d["break_glass"] == true })
	})

	t.Run("no credential but audit's writes the trail", func(t *testing.T) {
		conns := map[string]*nats.Conn{
			"operator": s.connect(t, 0, s.creds(busauth.RoleOperator)),
			"admin":    s.connect(t, 0, busauth.CredentialsOption(bob.creds)),
			"approver": s.connect(t, 0, busauth.CredentialsOption(alice.creds)),
			"auditor":  s.connect(t, 0, busauth.CredentialsOption(carol.creds)),
			"control":  s.connect(t, 0, s.creds(busauth.RoleControl)),
		}
		for who, nc := range conns {
			for _, subject := range []string{"audit.demo.x", "tool.result.demo.x"} {
				got, err := refused(t, nc, false, subject)
				if err != nil {
					t.Fatal(err)
				}
				if !got {
					t.Errorf("%s may publish on %s", who, subject)
				}
			}
		}
		// What the operator's publish would have written is not in the
		// trail.
		st, err := ojs.Stream(ctx, subjects.StreamAudit)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.GetLastMsgForSubject(ctx, "audit.demo.x"); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatalf("audit.demo.x in AUDIT: %v, want none", err)
		}
	})

	t.Run("people read the trail by direct gets, never with a consumer", func(t *testing.T) {
		for who, p := range map[string]person{"approver": alice, "auditor": carol} {
			js, err := jetstream.New(s.connect(t, 0, busauth.CredentialsOption(p.creds)))
			if err != nil {
				t.Fatal(err)
			}
			st, err := js.Stream(ctx, subjects.StreamAudit)
			if err != nil {
				t.Fatalf("%s: stream info of AUDIT: %v", who, err)
			}
			if _, err := st.GetLastMsgForSubject(ctx, pushed); err != nil {
				t.Errorf("%s: a direct get of AUDIT: %v", who, err)
			}
			cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
			_, err = js.OrderedConsumer(cctx, subjects.StreamAudit, jetstream.OrderedConsumerConfig{})
			ccancel()
			if err == nil {
				t.Errorf("%s created a consumer on AUDIT", who)
			}
			// The client's tail (the console's) reads it so.
			c := p.client(t, s, nil)
			n := 0
			if err := c.TailLast(ctx, "", 3, func(string, []byte) error { n++; return nil }); err != nil || n != 3 {
				t.Errorf("%s: the last 3 events: %d read, %v", who, n, err)
			}
		}
		// A live tail sees a new event: the operator's next push.
		tctx, tcancel := context.WithTimeout(ctx, 20*time.Second)
		defer tcancel()
		seen := make(chan struct{})
		go func() {
			_ = alice.client(t, s, nil).Tail(tctx, subjects.SystemTenant, false, func(subject string, _ []byte) error {
				if subject == pushed {
					close(seen)
					return errors.New("seen")
				}
				return nil
			})
		}()
		// The tail starts at the events stored after it began: push until
		// it sees one.
		admin := bob.client(t, s, nil)
		for done := false; !done; {
			if _, err := admin.PushPolicy(ctx, modules, nil, ""); err != nil {
				t.Fatal(err)
			}
			select {
			case <-seen:
				done = true
			case <-time.After(time.Second):
			case <-tctx.Done():
				t.Fatal("the approver's live tail did not see the new event")
			}
		}
	})
}
