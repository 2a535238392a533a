package node_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// shadowSigned: on an authenticated bus, authorize evaluates a
// candidate an operator signed and emits its divergences with its own
// rights, for audit to publish; promoted with the operator's signature, the candidate rules every
// reader; a candidate written straight into the bucket (control may write
// it) is ignored and audited.
func shadowSigned(t *testing.T, s *served) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	op := s.operator(t)
	tenant := s.tenant("shsig")
	nc, raw := s.agent(t, 1, tenant)
	ac, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	call := func(msg string) api.Response {
		t.Helper()
		id, err := ac.Invoke(ctx, api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"` + msg + `"}`),
			AgentContext: api.AgentContext{AgentDID: "did:agent:" + tenant, TenantID: tenant}, CapabilityToken: raw}, client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := ac.Wait(ctx, tenant, id)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	audit, err := ojs.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	cand := map[string]string{"authz.rego": policy.DefaultModule(), "candidate.rego": `package toolgate.authz

deny contains {"msg": "echo may not say secret", "code": "E3209"} if {
	input.tool.id == "echo"
	contains(input.request.parameters.message, "secret")
}
`}
	if _, err := op.PushShadowPolicy(ctx, cand, nil, ""); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "authorize to publish a divergence", func() bool {
		if r := call("a secret"); r.Status != api.StatusSuccess {
			t.Fatalf("the live policy ruled otherwise: %+v", r)
		}
		m, err := audit.GetLastMsgForSubject(ctx, subjects.AuditEvent(tenant, "policy.shadow.diverged"))
		// Authorize emits it on the relay, signed; audit publishes it.
		return err == nil && strings.Contains(string(m.Data), "echo may not say secret")
	})
	if _, err := op.PromoteShadowPolicy(ctx, ""); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the promoted candidate to rule", func() bool {
		r := call("another secret")
		return r.Error != nil && r.Error.ECode == api.EPolicyDenied
	})
	if r := call("hello"); r.Status != api.StatusSuccess {
		t.Fatalf("after the promotion: %+v", r)
	}

	// Written straight into the bucket by the control role, without an
	// operator's signature: ignored and audited.
	cjs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleControl)))
	cs, err := kvstore.Open(ctx, cjs, kvstore.Options{Bind: true, Buckets: busauth.Rights[busauth.RoleControl].Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := cs.PushShadowPolicy(ctx, kvstore.PolicyBundle{Modules: map[string]string{"authz.rego": policy.DefaultModule()}, PushedBy: "operator:local"})
	if err != nil {
		t.Fatal(err)
	}
	stateRefused(t, ctx, ojs, "shadow policy", rev, "urn:toolgate:authorize")
}
