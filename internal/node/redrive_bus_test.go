package node_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/subjects"
)

// redriveSigned: on an authenticated bus, with every role's own rights, audit keeps the dead letter, control reads it and starts the
// re-drive, and authorize admits a re-drive only with an operator's signed
// run request: one an agent labels a re-drive itself is refused (E3904),
// the operator's runs with the agent's token or on the operator's
// decision, recorded under the signing operator.
func redriveSigned(t *testing.T, s *served) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	op := s.operator(t)
	const me, tool = "operator:local", "rd.guarded"
	tenant := s.tenant("rdsig")
	since := time.Now()
	if _, err := op.RegisterTool(ctx, []byte(`{"id":"`+tool+`","name":"guarded","version":"1.0.0","description":"a test tool",
	  "kind":"builtin","builtin":{"function":"noop"},"input_schema":{"type":"object"},"safety":{"risk_level":"low"},
	  "circuit_breaker":{"failure_rate_threshold":50,"sliding_window_size":20,"minimum_calls":10,"wait_duration_seconds":30}}`), false); err != nil {
		t.Fatal(err)
	}
	nc, raw := s.agent(t, 1, tenant)
	ac, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	req := api.Request{ToolID: tool, Parameters: json.RawMessage(`{}`),
		AgentContext: api.AgentContext{AgentDID: "did:agent:" + tenant, TenantID: tenant}, CapabilityToken: raw}
	wait := func(id string) api.Response {
		t.Helper()
		r, err := ac.Wait(ctx, tenant, id)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	call := func() api.Response {
		t.Helper()
		id, err := ac.Invoke(ctx, req, client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return wait(id)
	}
	if _, err := op.SetBreaker(ctx, tool, api.BreakerOpen, ""); err != nil {
		t.Fatal(err)
	}
	var failed []string
	eventually(t, 20*time.Second, "three calls ended on the open breaker", func() bool {
		if r := call(); r.Error != nil && r.Error.ECode == api.EBreakerOpen {
			failed = append(failed, r.InvocationID)
		}
		return len(failed) == 3
	})
	if _, err := op.SetBreaker(ctx, tool, api.BreakerRelease, ""); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the released breaker to let calls through", func() bool { return call().Status == api.StatusSuccess })
	eventually(t, 10*time.Second, "the dead letters", func() bool {
		l, err := op.RedriveList(ctx, api.RedriveListRequest{RedriveFilter: api.RedriveFilter{Tenant: tenant, Code: api.EBreakerOpen, Since: &since}})
		return err == nil && len(l.Entries) == 3
	})

	// An agent labels its own call a re-drive by the operator.
	forged := req
	forged.Redrive = &api.Redrive{Original: failed[0], Root: failed[0], Depth: 1, By: me,
		Proof: &api.DecisionProof{Subject: subjects.SvcRedriveRun, Headers: map[string][]string{}, Body: []byte(`{"tenant_id":"` + tenant + `"}`)}}
	id, err := ac.Invoke(ctx, forged, client.InvokeOptions{ID: subjects.RedriveID(failed[0], 1)})
	if err != nil {
		t.Fatal(err)
	}
	if r := wait(id); r.Error == nil || r.Error.ECode != api.ERedriveRefused {
		t.Fatalf("a re-drive no operator signed: %+v, want %s", r, api.ERedriveRefused)
	}

	// The operator's, with the agent's token.
	out, err := op.RedriveRun(ctx, api.RedriveRunRequest{Tenant: tenant, IDs: []string{failed[1]}}, raw)
	if err != nil || len(out.Runs) != 1 || out.Runs[0].Error != nil {
		t.Fatalf("run: %+v %v", out, err)
	}
	r := wait(out.Runs[0].RedriveID)
	if r.Status != api.StatusSuccess || r.ExecutionMetadata.Redrive == nil || r.ExecutionMetadata.Redrive.By != me {
		t.Fatalf("the re-drive with the token: %+v", r)
	}
	// The operator's decision: the original's principal, signed by
	// authorize, without the token.
	shown, err := op.RedriveShow(ctx, tenant, failed[2])
	if err != nil {
		t.Fatal(err)
	}
	out, err = op.RedriveRun(ctx, api.RedriveRunRequest{Tenant: tenant, IDs: []string{failed[2]}, Decision: true, Reason: "breaker released",
		Digests: map[string]string{failed[2]: shown.Digest}}, "")
	if err != nil || len(out.Runs) != 1 || out.Runs[0].Error != nil {
		t.Fatalf("decision run: %+v %v", out, err)
	}
	r = wait(out.Runs[0].RedriveID)
	if rd := r.ExecutionMetadata.Redrive; r.Status != api.StatusSuccess || rd == nil || rd.By != me || !rd.Decision {
		t.Fatalf("the re-drive on the decision: %+v", r)
	}
	// Unsigned, the endpoints refuse.
	plain, _ := client.New(s.connect(t, 0, s.creds("operator")))
	if _, err := plain.RedriveList(ctx, api.RedriveListRequest{RedriveFilter: api.RedriveFilter{Tenant: tenant}}); !isCode(err, api.EAdminUnverified) {
		t.Fatalf("an unsigned listing: %v, want %s", err, api.EAdminUnverified)
	}
}
