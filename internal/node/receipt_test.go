package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/subjects"
)

// TestReceiptsOnTheBus: on the authenticated embedded bus, a call's
// result carries audit's receipt, signed with the chain key: of its agent,
// tool, manifest, parameters, policy decision and result. An auditor and
// the operator get it back with its inclusion proof once a checkpoint
// covers the terminal event; the agent gets it with the proof under the
// checkpoint's signed head alone (its listing names other tenants' calls),
// and another agent of the tenant is refused (E3260) and the refusal
// audited.
func TestReceiptsOnTheBus(t *testing.T) {
	s := serveEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pub, err := busauth.LoadAuditChainPublicKey(s.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	a := s.agentAs(t, "did:agent:a", false)
	b := s.agentAs(t, "did:agent:b", false)

	params := json.RawMessage(`{"message": "receipted"}`)
	id, err := a.c.Invoke(ctx, api.Request{ToolID: "echo", Parameters: params,
		AgentContext: api.AgentContext{AgentDID: a.did, TenantID: "demo"}, CapabilityToken: a.raw}, client.InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := a.c.Wait(ctx, "demo", id)
	if err != nil || resp.Status != api.StatusSuccess {
		t.Fatalf("the call: %+v, %v", resp, err)
	}
	r := resp.Receipt
	if r == nil {
		t.Fatalf("the result carries no receipt: %+v", resp)
	}
	if err := auditchain.CheckReceipt(r, pub); err != nil {
		t.Fatal(err)
	}
	if err := auditchain.CheckReceiptResult(r, resp.Result); err != nil {
		t.Fatal(err)
	}
	if r.InvocationID != id || r.Tenant != "demo" || r.Agent != a.did || r.ToolID != "echo" || r.ToolVersion == "" ||
		r.ManifestDigest == "" || r.Decision != "allow" || r.Status != api.StatusSuccess ||
		r.ParamsSHA256 != auditchain.Digest(params) || r.EventID != id+":tool.succeeded" || r.IssuedAt == "" {
		t.Errorf("receipt %+v", r)
	}

	// get waits for the proof and checks it.
	get := func(t *testing.T, c *client.Agent) api.ReceiptResponse {
		t.Helper()
		var got api.ReceiptResponse
		eventually(t, 30*time.Second, "the receipt's proof", func() bool {
			var err error
			got, err = c.Receipt(ctx, "demo", id)
			if err != nil {
				t.Fatal(err)
			}
			return len(got.Proof) > 0
		})
		var p auditchain.Proof
		if err := json.Unmarshal(got.Proof, &p); err != nil {
			t.Fatal(err)
		}
		if err := auditchain.CheckReceiptProof(got.Receipt, &p, pub); err != nil {
			t.Fatal(err)
		}
		if got.Receipt.Sig != r.Sig {
			t.Fatalf("another receipt than the result's: %+v", got.Receipt)
		}
		return got
	}
	t.Run("its agent", func(t *testing.T) {
		// The proof with its checkpoint's signed head alone: the listing,
		// which names other tenants' calls, is left out.
		got := get(t, a.c)
		var p struct {
			Checkpoint map[string]json.RawMessage `json:"checkpoint"`
		}
		if err := json.Unmarshal(got.Proof, &p); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"ids", "tenants", "leaves"} {
			if _, ok := p.Checkpoint[k]; ok {
				t.Errorf("the agent's proof shows the checkpoint's %s", k)
			}
		}
		if _, ok := p.Checkpoint["listing"]; !ok {
			t.Errorf("the agent's proof has no listing hash: %s", got.Proof)
		}
	})
	t.Run("an auditor", func(t *testing.T) {
		keys, err := busauth.LoadKeys(s.dataDir)
		if err != nil {
			t.Fatal(err)
		}
		carol := issuePerson(t, keys, busauth.RoleAuditor, "carol")
		// The auditor's proof holds the checkpoint's listing too.
		var p auditchain.Proof
		if err := json.Unmarshal(get(t, carol.client(t, s, nil).Agent).Proof, &p); err != nil {
			t.Fatal(err)
		}
		if len(p.Checkpoint.IDs) == 0 || p.Checkpoint.Check(pub) != nil {
			t.Errorf("the auditor's checkpoint has no listing, or one that does not check: %+v", p.Checkpoint)
		}
	})
	t.Run("the operator", func(t *testing.T) { get(t, s.operator(t).Agent) })
	t.Run("another agent is refused, and audited", func(t *testing.T) {
		_, err := b.c.Receipt(ctx, "demo", id)
		var te *api.Error
		if !errors.As(err, &te) || te.ECode != api.ENotOwnCall {
			t.Fatalf("B's receipt of A's call: %v, want E3260", err)
		}
		js, err := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "a view.refused audit event naming B, the receipt and A's call", func() bool {
			st, err := js.Stream(ctx, subjects.StreamAudit)
			if err != nil {
				return false
			}
			m, err := st.GetLastMsgForSubject(ctx, subjects.AuditEvent(subjects.SystemTenant, "view.refused"))
			if err != nil {
				return false
			}
			d := string(m.Data)
			return strings.Contains(d, "did=3Aagent=3Ab") && strings.Contains(d, id) && strings.Contains(d, `"receipt"`)
		})
	})
	t.Run("an approved call's receipt names its approver and the signed decision", func(t *testing.T) {
		keys, err := busauth.LoadKeys(s.dataDir)
		if err != nil {
			t.Fatal(err)
		}
		alice := issuePerson(t, keys, busauth.RoleApprover, "alice")
		id, err := a.c.Invoke(ctx, api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"approved"}`),
			AgentContext: api.AgentContext{AgentDID: a.did, TenantID: "demo"}, CapabilityToken: a.raw,
			ExecutionOptions: &api.ExecutionOptions{RequireApproval: true}}, client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "the call to wait for approval", func() bool {
			rec, err := a.c.Status(ctx, "demo", id)
			return err == nil && rec.Status == api.StatusPendingApproval
		})
		ap := alice.client(t, s, nil)
		sum, err := ap.Approval(ctx, "demo", id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ap.DecideSigned(ctx, api.ApprovalDecision{Tenant: "demo", InvocationID: id, Approve: true,
			RequestDigest: sum.RequestDigest}, alice.sign); err != nil {
			t.Fatal(err)
		}
		resp, err := a.c.Wait(ctx, "demo", id)
		if err != nil || resp.Status != api.StatusSuccess || resp.Receipt == nil {
			t.Fatalf("the approved call: %+v, %v", resp, err)
		}
		rc := resp.Receipt
		if err := auditchain.CheckReceipt(rc, pub); err != nil {
			t.Fatal(err)
		}
		if len(rc.Approvers) != 1 || rc.Approvers[0] != "approver:alice" || rc.Approval == nil ||
			!strings.Contains(string(rc.Approval.Body), id) || len(rc.Approval.Headers) == 0 {
			t.Fatalf("the receipt's approval: %v %+v", rc.Approvers, rc.Approval)
		}
	})
	t.Run("the receipt names the pushed policy's revision", func(t *testing.T) {
		op := s.operator(t)
		op.Sign = s.signer(t, busauth.RoleOperator)
		pushed, err := op.PushPolicy(ctx, map[string]string{"authz.rego": policy.DefaultModule()}, nil, "")
		if err != nil {
			t.Fatal(err)
		}
		var rc *api.Receipt
		eventually(t, 20*time.Second, "a call decided by the pushed policy", func() bool {
			id, err := a.c.Invoke(ctx, api.Request{ToolID: "echo", Parameters: params,
				AgentContext: api.AgentContext{AgentDID: a.did, TenantID: "demo"}, CapabilityToken: a.raw}, client.InvokeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			resp, err := a.c.Wait(ctx, "demo", id)
			if err != nil || resp.Receipt == nil {
				t.Fatalf("%+v %v", resp, err)
			}
			rc = resp.Receipt
			return rc.PolicyRevision == pushed.Revision
		})
		if err := auditchain.CheckReceipt(rc, pub); err != nil || pushed.Revision == 0 {
			t.Fatalf("revision %d: %v", pushed.Revision, err)
		}
	})
	t.Run("the result is sealed by its receipt alone; a copy altered or sent by another role is refused, and audited", func(t *testing.T) {
		ojs, err := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
		if err != nil {
			t.Fatal(err)
		}
		results, err := ojs.Stream(ctx, subjects.StreamResults)
		if err != nil {
			t.Fatal(err)
		}
		subject := subjects.Result("demo", a.did, id)
		m, err := results.GetLastMsgForSubject(ctx, subject)
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(seal.HeaderSeal) != seal.SealReceipt || m.Header.Get(seal.HeaderSignature) != "" ||
			m.Header.Get(seal.HeaderSigner) != string(busauth.RoleAudit) {
			t.Fatalf("the result's headers %v: want audit's seal and no signature of its own", m.Header)
		}
		hops, err := busauth.LoadHopPublicKeys(s.dataDir)
		if err != nil {
			t.Fatal(err)
		}
		msgs := seal.NewMessages(hops)
		msgs.TrustReceipts(pub)
		if role, err := msgs.Sender(subject, m.Header, m.Data); err != nil || role != busauth.RoleAudit {
			t.Fatalf("the result as published: %v %v", role, err)
		}
		var sealed api.Receipt
		if rr, err := auditchain.OpenResult(m.Data, pub); err != nil || rr.Sig != r.Sig {
			t.Fatalf("the result's seal is not the receipt the caller got: %v", err)
		} else {
			sealed = *rr
		}
		changed := strings.Replace(string(m.Data), "receipted", "receipteD", 1)
		if _, err := msgs.Sender(subject, m.Header, []byte(changed)); ecode(err) != api.EReceiptEnding {
			t.Fatalf("a changed byte of the result: %v, want E3905", err)
		}
		if err := auditchain.CheckReceiptResult(&sealed, json.RawMessage(`{"echo":"another"}`)); ecode(err) != api.EReceiptResult {
			t.Fatalf("the receipt against another result: %v, want E3961", err)
		}
		// Validate, which may relay a pending answer only, sends the
		// very bytes with audit's seal: the relay refuses the seal of a
		// role that is not audit's, and audits it.
		vjs, err := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleValidate)))
		if err != nil {
			t.Fatal(err)
		}
		forged := fmt.Sprintf("forged-seal-%d", time.Now().UnixNano())
		fsubject := subjects.Result("demo", a.did, forged)
		h := nats.Header{seal.HeaderSeal: {seal.SealReceipt}}
		if _, err := runner.Relaying(seal.SigningJetStream(vjs, s.hopSigner(t, busauth.RoleValidate))).PublishMsg(ctx,
			&nats.Msg{Subject: fsubject, Header: h, Data: m.Data}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "a poison event for the relayed seal", func() bool {
			p, err := ojs.Stream(ctx, subjects.StreamAudit)
			if err != nil {
				return false
			}
			ev, err := p.GetLastMsgForSubject(ctx, subjects.AuditEvent("demo", envelope.SubjectSuffix(api.TypePoison)))
			return err == nil && strings.Contains(string(ev.Data), subjects.Relay(fsubject)) && strings.Contains(string(ev.Data), api.EMessageUnsigned)
		})
		if _, err := results.GetLastMsgForSubject(ctx, fsubject); err == nil {
			t.Fatal("audit published the relayed seal")
		}
	})
	t.Run("no receipt of an unknown call", func(t *testing.T) {
		_, err := a.c.Receipt(ctx, "demo", "no-such-call")
		var te *api.Error
		if !errors.As(err, &te) || te.ECode != api.EReceiptNotFound {
			t.Fatalf("%v, want E3964", err)
		}
	})
}

func ecode(err error) string {
	var te *api.Error
	if errors.As(err, &te) {
		return te.ECode
	}
	return ""
}
