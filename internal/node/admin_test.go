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
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// TestAdminThroughControl: every operator change goes through the control
// service on an authenticated bus. The operator's signed request takes
// effect, records the signing operator whatever the body says, and is
// audited naming that operator; worker and agent credentials are refused by
// the server, and an unsigned or worker-signed request by the service.
func TestAdminThroughControl(t *testing.T) {
	dir := t.TempDir()
	n, url := runServed(t, node.Config{Embedded: node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: dir}, GrantSigner: testKey()})
	s := &served{urls: []string{url}, dataDir: dir, node: n}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	op := s.operator(t)
	const me = "operator:local"

	// A guarded tool: low risk, a breaker, a capability to request.
	const tool = "adm.guarded"
	if _, err := op.RegisterTool(ctx, []byte(`{"id":"`+tool+`","name":"guarded","version":"1.0.0","description":"a test tool",
	  "kind":"builtin","builtin":{"function":"noop"},"input_schema":{"type":"object"},"capabilities":["tally_rows"],
	  "safety":{"risk_level":"low","idempotent":true},"limits":{"timeout_ms":500},
	  "circuit_breaker":{"failure_rate_threshold":50,"sliding_window_size":20,"minimum_calls":10,"wait_duration_seconds":30,"half_open_calls":1}}`), false); err != nil {
		t.Fatal(err)
	}
	nc, raw := s.agent(t, 1, "demo")
	ac, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	call := func(id string) api.Response {
		t.Helper()
		inv, err := ac.Invoke(ctx, api.Request{ToolID: id, Parameters: json.RawMessage(`{}`),
			AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}, CapabilityToken: raw}, client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := ac.Wait(ctx, "demo", inv)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	// audited waits for the last _system audit event of suffix to hold
	// every one of want.
	audited := func(suffix string, want ...string) {
		t.Helper()
		var last string
		eventually(t, 10*time.Second, "audit event "+suffix, func() bool {
			st, err := ojs.Stream(ctx, subjects.StreamAudit)
			if err != nil {
				return false
			}
			m, err := st.GetLastMsgForSubject(ctx, subjects.AuditEvent(subjects.SystemTenant, suffix))
			if err != nil {
				return false
			}
			last = string(m.Data)
			for _, w := range want {
				if !strings.Contains(last, w) {
					return false
				}
			}
			return true
		})
		if t.Failed() {
			t.Logf("last %s event: %s", suffix, last)
		}
	}
	by := `"by":"` + me + `"`
	audited("admin.tool.registered", by, `"target":"`+tool+`@1.0.0"`)

	t.Run("refused to stages and agents by the server", func(t *testing.T) {
		dials := map[string]func() *nats.Conn{
			"agent": func() *nats.Conn { nc, _ := s.agent(t, 0, "demo"); return nc },
		}
		for _, r := range busauth.StageRoles {
			dials[string(r)] = func() *nats.Conn { return s.connect(t, 0, s.creds(r)) }
		}
		for _, subject := range subjects.AdminServices {
			for role, dial := range dials {
				nc := dial()
				got, err := refused(t, nc, false, subject)
				if err != nil {
					t.Fatal(err)
				}
				if !got {
					t.Errorf("%s may publish %s", role, subject)
				}
			}
		}
	})

	t.Run("unsigned or signed by a stage or control is refused by the service", func(t *testing.T) {
		unsigned, _ := client.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
		stage, _ := client.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
		stage.Sign = s.signer(t, busauth.RoleExecute)
		ctl, _ := client.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
		ctl.Sign = s.signer(t, busauth.RoleControl)
		for name, c := range map[string]*client.Client{"unsigned": unsigned, "execute-signed": stage, "control-signed": ctl} {
			_, err := c.RevokeToken(ctx, "never", time.Now().Add(time.Hour), "", "mallory")
			if !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.EAdminUnverified}) {
				t.Errorf("%s revoke: %v, want E3219", name, err)
			}
			if _, err := c.Policy(ctx); !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.EAdminUnverified}) {
				t.Errorf("%s policy.get: %v, want E3219", name, err)
			}
			doc := `{"id":"sneaky","name":"sneaky","version":"1.0.0","description":"registered without an operator",
				"category":"utility","kind":"builtin","builtin":{"function":"echo"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
				"safety":{"risk_level":"low"}}`
			if _, err := c.RegisterTool(ctx, []byte(doc), false); !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.EAdminUnverified}) {
				t.Errorf("%s tools.register: %v, want E3219", name, err)
			}
			if _, err := c.DeleteTool(ctx, tool, "1.0.0"); !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.EAdminUnverified}) {
				t.Errorf("%s tools.delete: %v, want E3219", name, err)
			}
		}
	})

	// The control role may write the policies bucket (the push endpoint
	// does), but a bundle no operator signed rules nothing: authorize and
	// the control service ignore it and audit that they did.
	t.Run("a policy written straight into the bucket rules nothing", func(t *testing.T) {
		cjs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleControl)))
		cs, err := kvstore.Open(ctx, cjs, kvstore.Options{Bind: true, Buckets: busauth.Rights[busauth.RoleControl].Buckets()})
		if err != nil {
			t.Fatal(err)
		}
		forged := kvstore.PolicyBundle{PushedBy: me, Modules: map[string]string{
			"authz.rego": policy.DefaultModule() + "\ndeny contains {\"code\": \"E3209\", \"msg\": \"forged\"} if input.tool.id == \"" + tool + "\"\n"}}
		rev, err := cs.PushPolicy(ctx, forged)
		if err != nil {
			t.Fatal(err)
		}
		ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
		as, err := ojs.Stream(ctx, subjects.StreamAudit)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf(`"revision":%d`, rev)
		for _, by := range []string{"urn:toolgate:authorize", "urn:toolgate:control"} {
			eventually(t, 10*time.Second, by+" to audit the unsigned policy", func() bool {
				m, err := as.GetLastMsgForSubject(ctx, subjects.AuditEvent(subjects.SystemTenant, "state.refused"))
				if err != nil {
					return false
				}
				// Both write the event; either may be last: look back.
				for seq := m.Sequence; seq > 0 && seq+50 > m.Sequence; seq-- {
					mm, err := as.GetMsg(ctx, seq)
					if err == nil && strings.Contains(string(mm.Data), want) && strings.Contains(string(mm.Data), `"by":"`+by+`"`) {
						return true
					}
				}
				return false
			})
		}
		if r := call(tool); r.Status != api.StatusSuccess {
			t.Fatalf("after the unsigned policy: %+v, want the call to run", r)
		}
	})

	// Every signed record verifies on its own: a bucket writer could put an
	// older signed policy back over a newer one. Readers refuse what was
	// signed before the policy in force, and audit it.
	t.Run("an older signed policy written back rules nothing", func(t *testing.T) {
		deny := map[string]string{"authz.rego": policy.DefaultModule() +
			"\ndeny contains {\"code\": \"E3209\", \"msg\": \"an old policy\"} if input.tool.id == \"" + tool + "\"\n"}
		if _, err := op.PushPolicy(ctx, deny, nil, ""); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the denying policy to rule", func() bool { return call(tool).Status != api.StatusSuccess })
		os, err := kvstore.Open(ctx, ojs, kvstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		old, ok, err := os.Policy(ctx)
		if err != nil || !ok || old.Proof == nil {
			t.Fatalf("reading the signed policy in force: %v %v", ok, err)
		}
		if _, err := op.PushPolicy(ctx, map[string]string{"authz.rego": policy.DefaultModule()}, nil, ""); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the newer policy to rule", func() bool { return call(tool).Status == api.StatusSuccess })
		cjs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleControl)))
		cs, err := kvstore.Open(ctx, cjs, kvstore.Options{Bind: true, Buckets: busauth.Rights[busauth.RoleControl].Buckets()})
		if err != nil {
			t.Fatal(err)
		}
		rev, err := cs.PushPolicy(ctx, old)
		if err != nil {
			t.Fatal(err)
		}
		as, err := ojs.Stream(ctx, subjects.StreamAudit)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf(`"revision":%d`, rev)
		eventually(t, 10*time.Second, "authorize to audit the replayed policy", func() bool {
			m, err := as.GetLastMsgForSubject(ctx, subjects.AuditEvent(subjects.SystemTenant, "state.refused"))
			if err != nil {
				return false
			}
			for seq := m.Sequence; seq > 0 && seq+50 > m.Sequence; seq-- {
				mm, err := as.GetMsg(ctx, seq)
				if err == nil && strings.Contains(string(mm.Data), want) && strings.Contains(string(mm.Data), "replayed") &&
					strings.Contains(string(mm.Data), "urn:toolgate:authorize") {
					return true
				}
			}
			return false
		})
		if r := call(tool); r.Status != api.StatusSuccess {
			t.Fatalf("after the replayed policy: %+v, want the newer policy still in force", r)
		}
		// Leave the bucket as the operator's newer push left it.
		if _, err := op.PushPolicy(ctx, map[string]string{"authz.rego": policy.DefaultModule()}, nil, ""); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a hook set written straight into the bucket rules nothing", func(t *testing.T) {
		cjs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleControl)))
		cs, err := kvstore.Open(ctx, cjs, kvstore.Options{Bind: true, Buckets: busauth.Rights[busauth.RoleControl].Buckets()})
		if err != nil {
			t.Fatal(err)
		}
		rev, err := cs.PushHooks(ctx, kvstore.HookSet{Tenant: "demo", PushedBy: me,
			Doc: json.RawMessage(`{"hooks":[{"name":"more","on":"success","invoke":{"tool_id":"` + tool + `"}}]}`)})
		if err != nil {
			t.Fatal(err)
		}
		ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
		as, err := ojs.Stream(ctx, subjects.StreamAudit)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf(`"what":"hooks","revision":%d`, rev)
		eventually(t, 10*time.Second, "audit to record the unsigned hook set it ignored", func() bool {
			m, err := as.GetLastMsgForSubject(ctx, subjects.AuditEvent(subjects.SystemTenant, "state.refused"))
			return err == nil && strings.Contains(string(m.Data), want) && strings.Contains(string(m.Data), "urn:toolgate:audit")
		})
		if err := cs.DeleteHooks(ctx, "demo"); err != nil {
			t.Fatal(err)
		}
	})

	// A tool manifest no operator signed is honoured by no reader: not a
	// new one, and not a signed one whose manifest was changed in the
	// bucket. Every reader ignores it and audits that it did.
	t.Run("a tool manifest written straight into the bucket is honoured by no reader", func(t *testing.T) {
		cjs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleControl)))
		cs, err := kvstore.Open(ctx, cjs, kvstore.Options{Bind: true, Buckets: busauth.Rights[busauth.RoleControl].Buckets()})
		if err != nil {
			t.Fatal(err)
		}
		const forgedDoc = `{"id":"forged.shell","name":"forged","version":"1.0.0","description":"registered without an operator",
			"kind":"builtin","builtin":{"function":"echo"},"input_schema":{"type":"object"},"safety":{"risk_level":"low"}}`
		if _, err := cs.RegisterTool(ctx, []byte(forgedDoc), false); err != nil {
			t.Fatal(err)
		}
		kv, err := cjs.KeyValue(ctx, kvstore.BucketTools)
		if err != nil {
			t.Fatal(err)
		}
		fe, err := kv.Get(ctx, subjects.Token("forged.shell")+"."+subjects.Token("1.0.0"))
		if err != nil {
			t.Fatal(err)
		}
		newRev := fe.Revision()
		readers := []string{"urn:toolgate:validate", "urn:toolgate:authorize", "urn:toolgate:route", "urn:toolgate:execute",
			"urn:toolgate:verify", "urn:toolgate:audit", "urn:toolgate:control"}
		stateRefused(t, ctx, ojs, "tool", newRev, readers...)

		// The operator's signed record of the guarded tool, its manifest
		// changed, keeps its signature.
		key := subjects.Token(tool) + "." + subjects.Token("1.0.0")
		e, err := kv.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		var rec kvstore.ToolRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.Proof == nil {
			t.Fatalf("the registered tool's record keeps no signed request: %s %v", e.Value(), err)
		}
		rec.Manifest = json.RawMessage(strings.Replace(string(rec.Manifest), `"a test tool"`, `"tampered"`, 1))
		val, _ := json.Marshal(rec)
		rev, err := kv.Put(ctx, key, val)
		if err != nil {
			t.Fatal(err)
		}
		stateRefused(t, ctx, ojs, "tool", rev, readers...)

		ctl, _ := client.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
		if doc, err := ctl.GetTool(ctx, tool, "1.0.0"); err != nil || strings.Contains(string(doc), "tampered") {
			t.Fatalf("tools.get after the tampered record: %s %v, want the signed manifest", doc, err)
		}
		if _, err := ctl.GetTool(ctx, "forged.shell", ""); !errors.Is(err, &api.Error{Code: api.ToolNotFound, ECode: api.EToolNotFound}) {
			t.Fatalf("tools.get of the unsigned tool: %v, want %s", err, api.EToolNotFound)
		}
		if l, err := ctl.ListTools(ctx, api.ListRequest{}); err != nil || strings.Contains(string(mustJSON(t, l)), "forged.shell") {
			t.Fatalf("tools.list lists the unsigned tool: %v", err)
		}
		if tl, err := ac.SearchTools(ctx, "demo", api.ListRequest{}); err != nil || strings.Contains(string(mustJSON(t, tl)), "forged.shell") {
			t.Fatalf("the agent's tools.list lists the unsigned tool: %v", err)
		}
		if r := call("forged.shell"); r.Error == nil || r.Error.ECode != api.EToolNotFound {
			t.Fatalf("calling the unsigned tool: %+v, want %s", r, api.EToolNotFound)
		}
		if r := call(tool); r.Status != api.StatusSuccess {
			t.Fatalf("the guarded tool after the tampered record: %+v", r)
		}
		// Put the signed record back for the rest.
		if _, err := kv.Put(ctx, key, e.Value()); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("policy push changes decisions and grants", func(t *testing.T) {
		capReq := api.CapabilityRequest{Capability: "tally_rows", InputContract: "rows", OutputContract: "a count",
			Reason: "counting", Constraints: api.DefaultCapabilityConstraints(), CapabilityToken: raw}
		before, err := ac.RequestCapability(ctx, "demo", capReq)
		if err != nil || before.Outcome != api.CapabilityGranted {
			t.Fatalf("before the push: %+v %v, want granted", before, err)
		}
		if r := call(tool); r.Status != api.StatusSuccess {
			t.Fatalf("before the push: %+v", r)
		}
		modules := map[string]string{
			"authz.rego": policy.DefaultModule() + "\ndeny contains {\"code\": \"E3209\", \"msg\": \"guarded is switched off\"} if input.tool.id == \"" + tool + "\"\n",
			"grant.rego": "package toolgate.capability\n\ngrant := {\"allow\": false, \"reasons\": [\"grants are off\"], \"tools\": []}\n",
		}
		res, err := op.PushPolicy(ctx, modules, nil, "mallory")
		if err != nil {
			t.Fatal(err)
		}
		if res.PushedBy != me {
			t.Fatalf("pushed by %q, want %s", res.PushedBy, me)
		}
		// The control service answers once it grants by the pushed rule.
		capReq.RequestID = "after-push"
		after, err := ac.RequestCapability(ctx, "demo", capReq)
		if err != nil || after.Outcome != api.CapabilityMatched || after.Refusal == nil || after.Refusal.ECode != api.ECapabilityNotGranted ||
			!strings.Contains(after.Refusal.Message, "grants are off") {
			t.Fatalf("after the push: %+v %v, want matched with E3044 (grants are off)", after, err)
		}
		eventually(t, 10*time.Second, "authorize to deny the guarded tool", func() bool {
			r := call(tool)
			return r.Error != nil && r.Error.ECode == api.EPolicyDenied && strings.Contains(r.Error.Message, "switched off")
		})
		got, err := op.Policy(ctx)
		if err != nil || !got.Pushed || got.Revision != res.Revision || got.PushedBy != me || len(got.Modules) != 2 {
			t.Fatalf("policy.get: %+v %v", got, err)
		}
		audited("admin.policy.pushed", by, `"action":"policy.push"`)
		// One that does not compile is refused and changes nothing.
		_, err = op.PushPolicy(ctx, map[string]string{"authz.rego": "package toolgate.authz\ndecision := {\n"}, nil, "")
		wantECode(t, err, api.EPolicyFailed)
		if again, _ := op.Policy(ctx); again.Revision != res.Revision {
			t.Fatal("a policy that does not compile was stored")
		}
		// Back to the shipped policy for the rest.
		if _, err := op.PushPolicy(ctx, map[string]string{"authz.rego": policy.DefaultModule()}, nil, ""); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "authorize to allow the guarded tool again", func() bool { return call(tool).Status == api.StatusSuccess })
	})

	t.Run("breaker set opens the breaker", func(t *testing.T) {
		st, err := op.SetBreaker(ctx, tool, api.BreakerOpen, "mallory")
		if err != nil {
			t.Fatal(err)
		}
		if st.State != api.BreakerOpen || !st.Forced || st.By != me {
			t.Fatalf("set: %+v", st)
		}
		eventually(t, 10*time.Second, "execute to refuse the guarded tool", func() bool {
			r := call(tool)
			return r.Error != nil && r.Error.ECode == api.EBreakerOpen && strings.Contains(r.Error.Message, me)
		})
		bs, err := op.Breakers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, b := range bs {
			found = found || (b.Key == tool && b.State == api.BreakerOpen && b.By == me)
		}
		if !found {
			t.Fatalf("breakers.list: %+v", bs)
		}
		audited("circuit.opened", by, `"key":"`+tool+`"`)
		if _, err := op.SetBreaker(ctx, tool, api.BreakerRelease, ""); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the released breaker to let calls through", func() bool { return call(tool).Status == api.StatusSuccess })
		if _, err := op.SetBreaker(ctx, tool, "ajar", ""); !errors.Is(err, &api.Error{Code: api.InvalidParameters, ECode: api.ERequestInvalid}) {
			t.Fatalf("state ajar: %v, want E3016", err)
		}
	})

	// Only an operator forces a breaker: a forced state written straight
	// into the bucket (execute and control may write it) is ignored and
	// audited, and so is a release of the operator's forced state.
	t.Run("a forced breaker state written straight into the bucket rules nothing", func(t *testing.T) {
		store := func(role busauth.Role) *kvstore.Store {
			js, _ := jetstream.New(s.connect(t, 0, s.creds(role)))
			st, err := kvstore.Open(ctx, js, kvstore.Options{Bind: true, Buckets: busauth.Rights[role].Buckets()})
			if err != nil {
				t.Fatal(err)
			}
			return st
		}
		es, cs := store(busauth.RoleExecute), store(busauth.RoleControl)
		forged, _, err := es.TransitionBreaker(ctx, tool, func(b *kvstore.BreakerState) bool {
			b.Forced, b.State, b.By, b.Since = true, kvstore.BreakerOpen, me, time.Now()
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		stateRefused(t, ctx, ojs, "breaker", forged.Revision, "urn:toolgate:execute")
		if r := call(tool); r.Status != api.StatusSuccess {
			t.Fatalf("after a forced open no operator signed: %+v, want the call to run", r)
		}
		if _, err := op.SetBreaker(ctx, tool, api.BreakerOpen, ""); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "execute to refuse the forced-open tool", func() bool {
			r := call(tool)
			return r.Error != nil && r.Error.ECode == api.EBreakerOpen
		})
		released, _, err := cs.TransitionBreaker(ctx, tool, func(b *kvstore.BreakerState) bool {
			b.Forced, b.State, b.Since = false, kvstore.BreakerClosed, time.Now()
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		stateRefused(t, ctx, ojs, "breaker", released.Revision, "urn:toolgate:execute")
		if r := call(tool); r.Error == nil || r.Error.ECode != api.EBreakerOpen {
			t.Fatalf("after a release no operator signed: %+v, want %s", r, api.EBreakerOpen)
		}
		if _, err := op.SetBreaker(ctx, tool, api.BreakerRelease, ""); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the released breaker to let calls through", func() bool { return call(tool).Status == api.StatusSuccess })
	})

	t.Run("hooks push is listed, delete removes it", func(t *testing.T) {
		doc := json.RawMessage(`{"hooks":[{"name":"overspent","on":"budget_exceeded","action":"continue"}]}`)
		res, err := op.PushHooks(ctx, "demo", doc, "mallory")
		if err != nil {
			t.Fatal(err)
		}
		if res.PushedBy != me || res.Hooks != 1 {
			t.Fatalf("push: %+v", res)
		}
		sets, err := op.HookSets(ctx, "demo")
		if err != nil || len(sets) != 1 || sets[0].PushedBy != me || sets[0].Revision != res.Revision || !strings.Contains(string(sets[0].Doc), "overspent") {
			t.Fatalf("list: %+v %v", sets, err)
		}
		audited("admin.hooks.pushed", by, `"target":"demo"`)
		_, err = op.PushHooks(ctx, "demo", json.RawMessage(`{"hooks":[{"on":"never","action":"continue"}]}`), "")
		wantECode(t, err, api.EHookInvalid)
		if err := op.DeleteHooks(ctx, "demo", "mallory"); err != nil {
			t.Fatal(err)
		}
		if sets, err := op.HookSets(ctx, "demo"); err != nil || len(sets) != 0 {
			t.Fatalf("after delete: %+v %v", sets, err)
		}
		audited("admin.hooks.deleted", by, `"target":"demo"`)
	})

	t.Run("revoke refuses the token", func(t *testing.T) {
		tok, c := agentToken(t, "demo", nil)
		if nc, err := s.dial(0, nats.Token(tok)); err != nil {
			t.Fatalf("before revocation: %v", err)
		} else {
			nc.Close()
		}
		res, err := op.RevokeToken(ctx, c.ID, time.Now().Add(time.Hour), "leaked", "mallory")
		if err != nil {
			t.Fatal(err)
		}
		if res.RevokedBy != me {
			t.Fatalf("revoked by %q", res.RevokedBy)
		}
		eventually(t, 10*time.Second, "the revoked token to be refused", func() bool {
			nc, err := s.dial(0, nats.Token(tok))
			if err == nil {
				nc.Close()
			}
			return err != nil
		})
		kv, err := ojs.KeyValue(ctx, kvstore.BucketRevocations)
		if err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, subjects.Token(c.ID))
		if err != nil || !strings.Contains(string(e.Value()), `"revoked_by":"`+me+`"`) {
			t.Fatalf("revocation record: %v %v", e, err)
		}
		audited("admin.token.revoked", by, `"target":"`+c.ID+`"`, `"reason":"leaked"`)
	})

	// Nothing but the token's expiry un-revokes it: the control role may
	// write the revocations bucket, but deleting or purging a revocation
	// lets the token neither connect nor invoke, and is audited.
	t.Run("a deleted revocation keeps the token revoked", func(t *testing.T) {
		tok, c := agentToken(t, "demo", nil)
		if _, err := op.RevokeToken(ctx, c.ID, time.Now().Add(time.Hour), "leaked", ""); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the revoked token to be refused", func() bool {
			nc, err := s.dial(0, nats.Token(tok))
			if err == nil {
				nc.Close()
			}
			return err != nil
		})
		cjs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleControl)))
		kv, err := cjs.KeyValue(ctx, kvstore.BucketRevocations)
		if err != nil {
			t.Fatal(err)
		}
		st, err := ojs.Stream(ctx, "KV_"+kvstore.BucketRevocations)
		if err != nil {
			t.Fatal(err)
		}
		for _, remove := range []func(context.Context, string, ...jetstream.KVDeleteOpt) error{kv.Delete, kv.Purge} {
			if err := remove(ctx, subjects.Token(c.ID)); err != nil {
				t.Fatal(err)
			}
			if _, err := kv.Get(ctx, subjects.Token(c.ID)); !errors.Is(err, jetstream.ErrKeyDeleted) && !errors.Is(err, jetstream.ErrKeyNotFound) {
				t.Fatalf("the revocation is still in the bucket: %v", err)
			}
			m, err := st.GetLastMsgForSubject(ctx, "$KV."+kvstore.BucketRevocations+"."+subjects.Token(c.ID))
			if err != nil {
				t.Fatal(err)
			}
			stateRefused(t, ctx, ojs, "revocation", m.Sequence, "urn:toolgate:authorize", "urn:toolgate:control")
		}
		for range 3 {
			if nc, err := s.dial(0, nats.Token(tok)); err == nil {
				nc.Close()
				t.Fatal("the token connects again after its revocation was deleted")
			}
			inv, err := ac.Invoke(ctx, api.Request{ToolID: tool, Parameters: json.RawMessage(`{}`),
				AgentContext: api.AgentContext{AgentDID: c.AgentDID, TenantID: "demo"}, CapabilityToken: tok}, client.InvokeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			r, err := ac.Wait(ctx, "demo", inv)
			if err != nil {
				t.Fatal(err)
			}
			if r.Error == nil || r.Error.ECode != api.ETokenRevoked {
				t.Fatalf("invoking with the token after its revocation was deleted: %+v, want %s", r, api.ETokenRevoked)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})

	t.Run("models register, list, delete", func(t *testing.T) {
		doc := json.RawMessage(`{"name":"adm-small","api":"openai","upstream_model":"gpt-4o-mini","endpoints":["https://api.example.com/v1"],
		  "tier":"small","context_window":128000,"max_output_tokens":4096,"price":{"input_per_1k":0.00015,"output_per_1k":0.0006}}`)
		if _, err := op.RegisterModel(ctx, doc, "mallory"); err != nil {
			t.Fatal(err)
		}
		ms, err := op.Models(ctx)
		if err != nil || !strings.Contains(string(mustJSON(t, ms)), `adm-small`) {
			t.Fatalf("list: %s %v", mustJSON(t, ms), err)
		}
		audited("admin.model.registered", by, `"target":"adm-small"`)
		_, err = op.RegisterModel(ctx, json.RawMessage(`{"name":"x"}`), "")
		wantECode(t, err, api.EInvalidManifest)
		wantECode(t, op.SetRoutingPolicy(ctx, "package toolgate.routing\nrank := {\n", ""), api.EPolicyFailed)
		if err := op.SetRoutingPolicy(ctx, "", "mallory"); err != nil {
			t.Fatal(err)
		}
		audited("admin.routing_policy.pushed", by)
		if err := op.DeleteModel(ctx, "adm-small", "mallory"); err != nil {
			t.Fatal(err)
		}
		audited("admin.model.deleted", by, `"target":"adm-small"`)
		wantECode(t, op.DeleteModel(ctx, "adm-small", ""), api.EModelUnknown)
	})

	// A model or routing policy no operator signed is honoured by no
	// reader: execute's catalogue and the control service's list ignore
	// it and audit that they did; so is a routing policy's delete.
	t.Run("document sources: signed ones serve, one written straight into the bucket serves nothing", func(t *testing.T) {
		docSourcesSigned(t, ctx, s, op, ac, raw)
	})

	t.Run("models and routing policy written straight into the bucket rule nothing", func(t *testing.T) {
		cjs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleControl)))
		cs, err := kvstore.Open(ctx, cjs, kvstore.Options{Bind: true, Buckets: busauth.Rights[busauth.RoleControl].Buckets()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.PutModel(ctx, []byte(`{"name":"forged-model","api":"openai","upstream_model":"gpt-4o-mini","endpoints":["https://attacker.example/v1"],
		  "tier":"small","context_window":128000,"max_output_tokens":4096,"price":{"input_per_1k":0,"output_per_1k":0}}`)); err != nil {
			t.Fatal(err)
		}
		kv, err := cjs.KeyValue(ctx, subjects.BucketModels)
		if err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, subjects.Token("forged-model"))
		if err != nil {
			t.Fatal(err)
		}
		ms, err := op.Models(ctx)
		if err != nil || strings.Contains(string(mustJSON(t, ms)), "forged-model") {
			t.Fatalf("models.list lists the unsigned model: %s %v", mustJSON(t, ms), err)
		}
		stateRefused(t, ctx, ojs, "model", e.Revision(), "urn:toolgate:execute", "urn:toolgate:control")
		if err := cs.PutRoutingPolicy(ctx, []byte("package toolgate.routing\n\nrank := []\n")); err != nil {
			t.Fatal(err)
		}
		e, err = kv.Get(ctx, "_routing")
		if err != nil {
			t.Fatal(err)
		}
		stateRefused(t, ctx, ojs, "routing_policy", e.Revision(), "urn:toolgate:execute")
		if err := kv.Delete(ctx, "_routing"); err != nil {
			t.Fatal(err)
		}
		e, err = kv.Get(ctx, "_routing")
		if !errors.Is(err, jetstream.ErrKeyDeleted) && !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("after the delete: %v %v", e, err)
		}
		// The delete marker's revision is the stream's last.
		st, err := ojs.Stream(ctx, "KV_"+subjects.BucketModels)
		if err != nil {
			t.Fatal(err)
		}
		m, err := st.GetLastMsgForSubject(ctx, "$KV."+subjects.BucketModels+"._routing")
		if err != nil {
			t.Fatal(err)
		}
		stateRefused(t, ctx, ojs, "routing_policy", m.Sequence, "urn:toolgate:execute")
		_ = kv.Delete(ctx, subjects.Token("forged-model"))
	})
}

// stateRefused waits until each of readers has audited ignoring the
// record of what at revision rev (ai.agent.state.refused).
func stateRefused(t *testing.T, ctx context.Context, js jetstream.JetStream, what string, rev uint64, readers ...string) {
	t.Helper()
	as, err := js.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`"what":%q,"revision":%d`, what, rev)
	for _, by := range readers {
		eventually(t, 10*time.Second, by+" to audit the "+what+" record it ignored", func() bool {
			m, err := as.GetLastMsgForSubject(ctx, subjects.AuditEvent(subjects.SystemTenant, "state.refused"))
			if err != nil {
				return false
			}
			// Every reader writes one; any may be last: look back.
			for seq := m.Sequence; seq > 0 && seq+400 > m.Sequence; seq-- {
				mm, err := as.GetMsg(ctx, seq)
				if err == nil && strings.Contains(string(mm.Data), want) && strings.Contains(string(mm.Data), `"by":"`+by+`"`) {
					return true
				}
			}
			return false
		})
	}
}
