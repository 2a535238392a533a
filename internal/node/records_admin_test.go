package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// TestForgedRevocationIgnored: the control role may write the revocations
// bucket, but a revocation it writes there without the operator's signed
// revoke request revokes nothing: the agent keeps its connection and its
// calls run, and the readers audit the record they ignored. The operator's
// own revocation still closes the connection.
func TestForgedRevocationIgnored(t *testing.T) {
	s := serveEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const tenant = "rvforge"
	raw, claims := agentToken(t, tenant, nil)
	closed := make(chan struct{})
	nc := s.connect(t, 0, nats.Token(raw), nats.CustomInboxPrefix(busauth.InboxPrefix(tenant, claims.ID)),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }), nats.NoReconnect())
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	cjs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleControl)))
	kv, err := cjs.KeyValue(ctx, subjects.BucketRevocations)
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Hour).UTC()
	val := fmt.Sprintf(`{"revoked_at":%q,"until":%q,"reason":"forged","revoked_by":"operator:local"}`,
		time.Now().UTC().Format(time.RFC3339Nano), until.Format(time.RFC3339Nano))
	rev, err := kv.Create(ctx, subjects.Token(claims.ID), []byte(val))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
		t.Fatal("a revocation the control role wrote into the bucket closed the agent's connection")
	case <-time.After(2 * time.Second):
	}
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	stateRefused(t, ctx, ojs, "revocation", rev, "urn:toolgate:authorize", "urn:toolgate:control")

	ac, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	id, err := ac.Invoke(ctx, api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"still here"}`),
		AgentContext: api.AgentContext{AgentDID: "did:agent:" + tenant, TenantID: tenant}, CapabilityToken: raw}, client.InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := ac.Wait(ctx, tenant, id); err != nil || r.Status != api.StatusSuccess {
		t.Fatalf("a call after the forged revocation: %+v %v", r, err)
	}
	if nc2, err := s.dial(0, nats.Token(raw), nats.CustomInboxPrefix(busauth.InboxPrefix(tenant, claims.ID))); err != nil {
		t.Fatalf("the token could not connect again after the forged revocation: %v", err)
	} else {
		nc2.Close()
	}

	// The operator's revocation, signed, still revokes.
	s.revoke(t, claims.ID)
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the operator's revocation did not close the connection")
	}
}

// TestForgedShadowCandidateNotPromoted: the control role rewrites the
// candidate an operator pushed (it may write the policies bucket); the
// operator's show does not present it as theirs, and the promote does not
// make it live.
func TestForgedShadowCandidateNotPromoted(t *testing.T) {
	s := serveEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	op := s.operator(t)
	strict := map[string]string{"authz.rego": policy.DefaultModule(), "candidate.rego": `package toolgate.authz

deny contains {"msg": "echo may not say secret", "code": "E3209"} if {
	input.tool.id == "echo"
	contains(input.request.parameters.message, "secret")
}
`}
	if _, err := op.PushShadowPolicy(ctx, strict, nil, ""); err != nil {
		t.Fatal(err)
	}
	cjs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleControl)))
	cs, err := kvstore.Open(ctx, cjs, kvstore.Options{Bind: true, Buckets: busauth.Rights[busauth.RoleControl].Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	signed, ok, err := cs.ShadowPolicy(ctx)
	if err != nil || !ok {
		t.Fatalf("the pushed candidate: %v %v", ok, err)
	}
	// The operator's record, its rule taken out, the signature kept.
	forged := signed
	forged.Modules = map[string]string{"authz.rego": policy.DefaultModule()}
	rev, err := cs.PushShadowPolicy(ctx, forged)
	if err != nil {
		t.Fatal(err)
	}

	b, err := op.ShadowPolicy(ctx)
	if err == nil && len(b.Modules) == 1 {
		t.Fatalf("show presents the control role's candidate as the operator's: %+v", b)
	}
	if !isCode(err, api.EShadowUnsigned) {
		t.Fatalf("show of the control role's candidate: %v, want %s", err, api.EShadowUnsigned)
	}
	if _, err := op.PromoteShadowPolicy(ctx, ""); err == nil {
		t.Fatal("the operator's promote made the control role's candidate live")
	}
	live := func() {
		t.Helper()
		if live, err := op.Policy(ctx); err != nil || live.Pushed {
			t.Fatalf("the live policy after a refused promote: %+v %v", live, err)
		}
	}
	live()
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	stateRefused(t, ctx, ojs, "shadow policy", rev, "urn:toolgate:control")

	// An older candidate an operator did sign, put back by the control
	// role after the operator was shown a newer one: the promote names
	// what was shown, and makes nothing live.
	lenient := map[string]string{"authz.rego": policy.DefaultModule()}
	if _, err := op.PushShadowPolicy(ctx, lenient, nil, ""); err != nil {
		t.Fatal(err)
	}
	older, _, err := cs.ShadowPolicy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.PushShadowPolicy(ctx, strict, nil, ""); err != nil {
		t.Fatal(err)
	}
	shown, err := op.ShadowPolicy(ctx)
	if err != nil || len(shown.Modules) != 2 || shown.Digest == "" {
		t.Fatalf("show of the operator's candidate: %+v %v", shown, err)
	}
	if _, err := cs.PushShadowPolicy(ctx, older); err != nil {
		t.Fatal(err)
	}
	if _, err := op.PromoteShownShadowPolicy(ctx, shown.Digest, ""); !isCode(err, api.EShadowChanged) {
		t.Fatalf("a promote of the candidate shown, another stored: %v, want %s", err, api.EShadowChanged)
	}
	live()
	// What is shown now, promoted, is what rules.
	now, err := op.ShadowPolicy(ctx)
	if err != nil || len(now.Modules) != 1 {
		t.Fatalf("show: %+v %v", now, err)
	}
	if _, err := op.PromoteShownShadowPolicy(ctx, now.Digest, ""); err != nil {
		t.Fatal(err)
	}
	if l, err := op.Policy(ctx); err != nil || !l.Pushed || len(l.Modules) != 1 {
		t.Fatalf("the live policy after the promote: %+v %v", l, err)
	}
}

// TestEditedDeadLetterNotRedriven: the audit role's credential may publish
// dead letters; one it republishes with other parameters after the
// operator's show is not what the operator's run starts, and one whose
// principal it changed, shown and run on the operator's decision, is
// refused by authorize: the principal is not the one it sealed.
func TestEditedDeadLetterNotRedriven(t *testing.T) {
	s := serveEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	op := s.operator(t)
	const tenant, tool = "rdedit", "rd.edited"
	if _, err := op.RegisterTool(ctx, []byte(`{"id":"`+tool+`","name":"edited","version":"1.0.0","description":"a test tool",
	  "kind":"builtin","builtin":{"function":"noop"},"input_schema":{"type":"object"},"safety":{"risk_level":"low"},
	  "circuit_breaker":{"failure_rate_threshold":50,"sliding_window_size":20,"minimum_calls":10,"wait_duration_seconds":30}}`), false); err != nil {
		t.Fatal(err)
	}
	nc, raw := s.agent(t, 1, tenant)
	ac, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	call := func() api.Response {
		t.Helper()
		id, err := ac.Invoke(ctx, api.Request{ToolID: tool, Parameters: json.RawMessage(`{"message":"as sent"}`),
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
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	dls, err := ojs.Stream(ctx, subjects.StreamDeadLetter)
	if err != nil {
		t.Fatal(err)
	}
	ajs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleAudit)))
	// edit republishes id's dead letter, as audit's credential may, changed
	// by change (other parameters when nil), with the headers sign gives it.
	edit := func(id string, sign func(subject string, h nats.Header, data []byte) nats.Header, change ...func(map[string]any)) {
		t.Helper()
		var m *jetstream.RawStreamMsg
		eventually(t, 10*time.Second, "the dead letter", func() bool {
			m, err = dls.GetLastMsgForSubject(ctx, subjects.DeadLetter(tenant, id))
			return err == nil
		})
		var d map[string]any
		if err := json.Unmarshal(m.Data, &d); err != nil {
			t.Fatal(err)
		}
		d["request"].(map[string]any)["parameters"] = map[string]any{"message": "edited by audit"}
		for _, c := range change {
			c(d)
		}
		data, _ := json.Marshal(d)
		h := nats.Header{"Content-Type": {"application/json"}}
		if sign != nil {
			h = sign(m.Subject, h, data)
		}
		if _, err := ajs.PublishMsg(ctx, &nats.Msg{Subject: m.Subject, Header: h, Data: data}); err != nil {
			t.Fatal(err)
		}
	}

	// Republished without audit's signature, after the operator's show.
	shown, err := op.RedriveShow(ctx, tenant, failed[0])
	if err != nil {
		t.Fatal(err)
	}
	edit(failed[0], nil)
	if after, err := op.RedriveShow(ctx, tenant, failed[0]); !isCode(err, api.EDeadLetterUnsigned) {
		t.Fatalf("show of the dead letter audit's credential rewrote: %+v %v, want %s", after, err, api.EDeadLetterUnsigned)
	}
	out, err := op.RedriveRun(ctx, api.RedriveRunRequest{Tenant: tenant, IDs: []string{failed[0]}, Decision: true, Reason: "test",
		Digests: map[string]string{failed[0]: shown.Digest}}, "")
	if err != nil || len(out.Runs) != 1 || out.Runs[0].Error == nil {
		t.Fatalf("the operator's run started the dead letter audit's credential rewrote: %+v %v", out, err)
	}
	if !isCode(out.Runs[0].Error, api.EDeadLetterUnsigned) {
		t.Fatalf("the run of an unsigned dead letter: %+v, want %s", out.Runs[0].Error, api.EDeadLetterUnsigned)
	}
	if l, err := op.RedriveList(ctx, api.RedriveListRequest{RedriveFilter: api.RedriveFilter{Tenant: tenant}}); err != nil || len(l.Entries) != len(failed)-1 {
		t.Fatalf("the listing holds the unsigned dead letter: %+v %v", l, err)
	}
	stateRefused(t, ctx, ojs, "dead letter", lastSeq(t, ctx, dls, tenant, failed[0]), "urn:toolgate:control")

	// Republished with audit's own key, after the operator's show: the run
	// names the dead letter shown, and starts nothing.
	key, err := busauth.LoadHopKey(s.dataDir, busauth.RoleAudit)
	if err != nil {
		t.Fatal(err)
	}
	shown, err = op.RedriveShow(ctx, tenant, failed[1])
	if err != nil || shown.Digest == "" {
		t.Fatalf("show: %+v %v", shown, err)
	}
	edit(failed[1], seal.NewSigner(busauth.RoleAudit, key).Sign)
	out, err = op.RedriveRun(ctx, api.RedriveRunRequest{Tenant: tenant, IDs: []string{failed[1]}, Decision: true, Reason: "test",
		Digests: map[string]string{failed[1]: shown.Digest}}, "")
	if err != nil || len(out.Runs) != 1 || !isCode(out.Runs[0].Error, api.EDeadLetterChanged) {
		t.Fatalf("the run of a dead letter changed since it was shown: %+v %v, want %s", out, err, api.EDeadLetterChanged)
	}
	stateRefused(t, ctx, ojs, "dead letter", lastSeq(t, ctx, dls, tenant, failed[1]), "urn:toolgate:control")
	// A decision that names no dead letter shown is refused too.
	out, err = op.RedriveRun(ctx, api.RedriveRunRequest{Tenant: tenant, IDs: []string{failed[1]}, Decision: true, Reason: "test"}, "")
	if err != nil || len(out.Runs) != 1 || !isCode(out.Runs[0].Error, api.ERequestInvalid) {
		t.Fatalf("a decision naming no digest: %+v %v", out, err)
	}

	// Republished with audit's own key and another token id in the
	// principal (one no revocation names), then shown: the operator's run
	// starts it, and authorize refuses the principal it did not seal.
	edit(failed[2], seal.NewSigner(busauth.RoleAudit, key).Sign, func(d map[string]any) {
		d["request"].(map[string]any)["parameters"] = map[string]any{"message": "as sent"}
		d["principal"].(map[string]any)["claims"].(map[string]any)["jti"] = "not-revoked"
	})
	if shown, err = op.RedriveShow(ctx, tenant, failed[2]); err != nil {
		t.Fatal(err)
	}
	out, err = op.RedriveRun(ctx, api.RedriveRunRequest{Tenant: tenant, IDs: []string{failed[2]}, Decision: true, Reason: "test",
		Digests: map[string]string{failed[2]: shown.Digest}}, "")
	if err != nil || len(out.Runs) != 1 || out.Runs[0].Error != nil {
		t.Fatalf("the run of a dead letter with another principal: %+v %v", out, err)
	}
	r, err := ac.Wait(ctx, tenant, out.Runs[0].RedriveID)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != api.StatusPermissionDenied || !isCode(r.Error, api.ERecordUnsigned) {
		t.Fatalf("the re-drive as a principal authorize did not seal: %s %+v, want %s", r.Status, r.Error, api.ERecordUnsigned)
	}
}

// lastSeq is the sequence of id's dead letter.
func lastSeq(t *testing.T, ctx context.Context, dls jetstream.Stream, tenant, id string) uint64 {
	t.Helper()
	m, err := dls.GetLastMsgForSubject(ctx, subjects.DeadLetter(tenant, id))
	if err != nil {
		t.Fatal(err)
	}
	return m.Sequence
}
