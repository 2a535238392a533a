package node_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/breaker"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// hookTools are manifests whose hooks the tests fire, one trigger each.
var hookTools = []string{
	`{"id":"hk.fallback","name":"fails","version":"1.0.0","description":"fails, falls back to echo","kind":"builtin",
	  "builtin":{"function":"maybe"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "hooks":[{"name":"to-echo","on":"failure","action":"retry_with_fallback",
	    "fallback":{"tool_id":"echo","tool_version":"1.0.0","parameters":{"message":"fallback for ${invocation.tool_id}: ${error.e_code}","was":"${invocation.parameters}"}}}]}`,
	`{"id":"hk.slow","name":"slow","version":"1.0.0","description":"times out, retried twice","kind":"builtin",
	  "builtin":{"function":"sleep"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},"limits":{"timeout_ms":100},
	  "hooks":[{"name":"again","on":"timeout","action":"retry","max_attempts":2}]}`,
	`{"id":"hk.loop","name":"loop","version":"1.0.0","description":"falls back to itself","kind":"builtin",
	  "builtin":{"function":"maybe"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "hooks":[{"name":"self","on":"failure","action":"retry_with_fallback","max_attempts":5,
	    "fallback":{"tool_id":"hk.loop","parameters":{"fail":true}}}]}`,
	`{"id":"hk.badcond","name":"bad condition","version":"1.0.0","description":"a condition that fails at run time","kind":"builtin",
	  "builtin":{"function":"maybe"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "hooks":[{"name":"broken","on":"failure","condition":"result.x.y == 1","action":"skip"}]}`,
	`{"id":"hk.noisy","name":"noisy","version":"1.0.0","description":"a failure ends the session","kind":"builtin",
	  "builtin":{"function":"maybe"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "hooks":[{"name":"stop","on":"failure","condition":"invocation.parameters.fail == true && error.e_code == 'E3108'","action":"abort"}]}`,
	`{"id":"hk.secret","name":"secret","version":"1.0.0","description":"denied, falls back to echo","kind":"builtin",
	  "builtin":{"function":"echo"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "hooks":[{"name":"public","on":"permission_denied","action":"retry_with_fallback",
	    "fallback":{"tool_id":"echo","parameters":{"message":"denied: ${error.e_code}"}}}]}`,
	`{"id":"hk.limited","name":"limited","version":"1.0.0","description":"one an hour","kind":"builtin",
	  "builtin":{"function":"noop"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "rate_limit":{"requests":1,"per_seconds":3600},"hooks":[{"name":"give-up","on":"rate_limited","action":"fail"}]}`,
	`{"id":"hk.fragile","name":"fragile","version":"1.0.0","description":"breaker forced open","kind":"builtin",
	  "builtin":{"function":"noop"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "circuit_breaker":{"failure_rate_threshold":50,"minimum_calls":2,"sliding_window_size":4,"wait_duration_seconds":600},
	  "hooks":[{"name":"pass","on":"circuit_open","action":"skip"}]}`,
}

// tenantHooks is the hook set pushed for tenant "hkt".
const tenantHooks = `{"hooks":[
  {"name":"overspent","on":"budget_exceeded","action":"continue","tools":["noop"]},
  {"name":"swap","on":"custom","condition":"status == 'success' && invocation.parameters.message == 'swap'",
   "action":"retry_with_fallback","fallback":{"tool_id":"echo","parameters":{"message":"swapped by ${trigger}${status}"}},"tools":["echo"]}]}`

// TestHooks: each trigger fires its hook through the real pipeline, and
// each action ends the call as docs/hooks.md says: a retry or fallback is a
// linked tool.invoke of its own (authorised, audited, ended once), a loop of
// them stops at the depth limit, a condition that fails at run time is
// audited and taken as false, abort ends the session, and a forged link is
// refused.
func TestHooks(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	// The tenant's hook set is in the bucket before the audit stage starts.
	store, err := kvstore.Open(ctx, e.js, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.PushHooks(ctx, kvstore.HookSet{Tenant: "hkt", Doc: json.RawMessage(tenantHooks)}); err != nil {
		t.Fatal(err)
	}
	n := e.startPipeline(node.Config{})
	registerTools(t, n, hookTools...)
	wait := func(tenant, id string) api.Response {
		t.Helper()
		resp, err := e.client.Wait(ctx, tenant, id)
		if err != nil {
			t.Fatalf("waiting for %s: %v", id, err)
		}
		return resp
	}
	hookOf := func(t *testing.T, r api.Response) *api.HookOutcome {
		t.Helper()
		if r.ExecutionMetadata == nil || r.ExecutionMetadata.Hook == nil {
			t.Fatalf("no hook outcome in %s", mustJSON(t, r))
		}
		return r.ExecutionMetadata.Hook
	}

	var decided api.Response // an invocation a hook handed on, in tenant hk1
	t.Run("failure falls back with mapped parameters", func(t *testing.T) {
		const tenant = "hk1"
		first := e.invoke(request(tenant, "hk.fallback", `{"fail":true}`))
		decided = first
		if first.Status != api.StatusError || first.Error.ECode != api.EToolFailed {
			t.Fatalf("original: %s", mustJSON(t, first))
		}
		h := hookOf(t, first)
		if h.Hook != "to-echo" || h.Trigger != "failure" || h.Action != "retry_with_fallback" || h.Source != "manifest" ||
			h.HandedTo != first.InvocationID+".hook1" {
			t.Fatalf("hook outcome %+v", h)
		}
		child := wait(tenant, h.HandedTo)
		if child.Status != api.StatusSuccess || child.ExecutionMetadata.ToolID != "echo" || hookOf(t, child).Parent != first.InvocationID {
			t.Fatalf("fallback: %s", mustJSON(t, child))
		}
		var got struct {
			Message string         `json:"message"`
			Was     map[string]any `json:"was"`
		}
		if err := json.Unmarshal(child.Result, &got); err != nil || got.Message != "fallback for hk.fallback: E3108" || got.Was["fail"] != true {
			t.Fatalf("fallback result %s", child.Result)
		}
		// Each ended once, with its own terminal audit event: the
		// original failed, the fallback was invoked and succeeded.
		if n := e.count(subjects.StreamAudit, subjects.AuditEvent(tenant, envelope.SubjectSuffix(api.TypeFailed))); n != 1 {
			t.Fatalf("%d failed events, want 1", n)
		}
		if n := e.count(subjects.StreamAudit, subjects.AuditEvent(tenant, envelope.SubjectSuffix(api.TypeSucceeded))); n != 1 {
			t.Fatalf("%d succeeded events, want 1", n)
		}
		if n := e.count(subjects.StreamResults, subjects.ResultTenant(tenant)); n != 2 {
			t.Fatalf("%d results, want 2", n)
		}
	})

	t.Run("timeout retries up to max_attempts", func(t *testing.T) {
		const tenant = "hk2"
		first := e.invoke(request(tenant, "hk.slow", `{"ms":3000}`))
		if first.Status != api.StatusTimeout || hookOf(t, first).Action != "retry" {
			t.Fatalf("original: %s", mustJSON(t, first))
		}
		second := wait(tenant, hookOf(t, first).HandedTo)
		if second.Status != api.StatusTimeout || hookOf(t, second).HandedTo != first.InvocationID+".hook2" {
			t.Fatalf("first retry: %s", mustJSON(t, second))
		}
		third := wait(tenant, hookOf(t, second).HandedTo)
		// The hook has started its two attempts: the chain ends here.
		if third.Status != api.StatusTimeout || third.ExecutionMetadata.Hook == nil || third.ExecutionMetadata.Hook.HandedTo != "" ||
			third.ExecutionMetadata.Hook.Parent != second.InvocationID {
			t.Fatalf("second retry: %s", mustJSON(t, third))
		}
	})

	t.Run("a loop of hooks stops at the depth limit", func(t *testing.T) {
		const tenant = "hk3"
		id, err := e.client.Invoke(ctx, request(tenant, "hk.loop", `{"fail":true}`), clientOpts(""))
		if err != nil {
			t.Fatal(err)
		}
		chain, err := e.client.Follow(ctx, tenant, id)
		if err != nil {
			t.Fatal(err)
		}
		// The call and the four hooks deep it may go; the last ends with
		// the limit, its own failure as the cause.
		if len(chain) != 5 {
			t.Fatalf("chain of %d: %s", len(chain), mustJSON(t, chain))
		}
		for i, r := range chain[:4] {
			if h := hookOf(t, r); h.HandedTo != chain[i+1].InvocationID || r.Error == nil || r.Error.ECode != api.EToolFailed {
				t.Fatalf("link %d: %s", i, mustJSON(t, r))
			}
		}
		r := chain[4]
		if r.Error == nil || r.Error.ECode != api.EHookLimit || hookOf(t, r).Parent != chain[3].InvocationID {
			t.Fatalf("chain end: %s", mustJSON(t, r))
		}
		cause, _ := r.Error.Details["cause"].(map[string]any)
		if cause["code"] != string(api.ToolExecutionError) {
			t.Fatalf("limit error without its cause: %s", mustJSON(t, r.Error))
		}
	})

	t.Run("a condition that fails at run time is audited and false", func(t *testing.T) {
		const tenant = "hk4"
		r := e.invoke(request(tenant, "hk.badcond", `{"fail":true}`))
		h := hookOf(t, r)
		if r.Status != api.StatusError || r.Error.ECode != api.EToolFailed || h.Action != "" || len(h.ConditionErrors) != 1 ||
			!strings.Contains(h.ConditionErrors[0], "broken") {
			t.Fatalf("got %s", mustJSON(t, r))
		}
		ev := e.auditOf(tenant, 2)[1]
		if ev.Type() != api.TypeFailed || !strings.Contains(string(ev.Data()), `"condition_errors"`) {
			t.Fatalf("terminal audit event %s: %s", ev.Type(), ev.Data())
		}
	})

	t.Run("abort ends the session's remaining calls", func(t *testing.T) {
		const tenant = "hk5"
		raw := mint(t, grant(tenant, "*"))
		other := mint(t, grant(tenant, "*"))
		if r := e.invoke(withTok(request(tenant, "hk.noisy", `{}`), raw)); r.Status != api.StatusSuccess {
			t.Fatalf("first call: %s", mustJSON(t, r))
		}
		r := e.invoke(withTok(request(tenant, "hk.noisy", `{"fail":true}`), raw))
		if r.Status != api.StatusError || hookOf(t, r).Action != "abort" || !hookOf(t, r).SessionAborted {
			t.Fatalf("aborting call: %s", mustJSON(t, r))
		}
		later := e.invoke(withTok(request(tenant, "echo", `{"message":"x"}`), raw))
		expectDenied(t, later, api.StatusPermissionDenied, api.ESessionAborted)
		// Another token's session goes on.
		if r := e.invoke(withTok(request(tenant, "echo", `{"message":"x"}`), other)); r.Status != api.StatusSuccess {
			t.Fatalf("another session: %s", mustJSON(t, r))
		}
		if n := e.count(subjects.StreamAudit, subjects.AuditEvent(tenant, envelope.SubjectSuffix(api.TypePermissionDenied))); n != 1 {
			t.Fatalf("%d permission_denied events, want 1", n)
		}
	})

	t.Run("permission denied falls back as the same principal", func(t *testing.T) {
		const tenant = "hk6"
		raw := mint(t, grant(tenant, "echo"))
		r := e.invoke(withTok(request(tenant, "hk.secret", `{"message":"x"}`), raw))
		if r.Status != api.StatusPermissionDenied || r.Error.ECode != api.ENotGranted || hookOf(t, r).Trigger != "permission_denied" {
			t.Fatalf("original: %s", mustJSON(t, r))
		}
		child := wait(tenant, hookOf(t, r).HandedTo)
		if child.Status != api.StatusSuccess || !strings.Contains(string(child.Result), "denied: E3210") {
			t.Fatalf("fallback: %s", mustJSON(t, child))
		}
	})

	t.Run("rate limited fails, not retryable", func(t *testing.T) {
		const tenant = "hk7"
		if r := e.invoke(request(tenant, "hk.limited", `{}`)); r.Status != api.StatusSuccess {
			t.Fatalf("first call: %s", mustJSON(t, r))
		}
		r := e.invoke(request(tenant, "hk.limited", `{}`))
		if r.Error == nil || r.Error.ECode != api.ERateLimited || r.Error.Retryable || hookOf(t, r).Action != "fail" {
			t.Fatalf("got %s", mustJSON(t, r))
		}
	})

	t.Run("circuit open is skipped", func(t *testing.T) {
		const tenant = "hk8"
		if _, err := breaker.Force(ctx, n.Store, nil, "hk.fragile", kvstore.BreakerOpen, "ops"); err != nil {
			t.Fatal(err)
		}
		var r api.Response
		eventually(t, 10*time.Second, "the forced breaker to reach execute", func() bool {
			r = e.invoke(request(tenant, "hk.fragile", `{}`))
			return r.Status != api.StatusSuccess
		})
		if r.Status != api.StatusCancelled || r.Error.ECode != api.EHookSkipped || hookOf(t, r).Trigger != "circuit_open" {
			t.Fatalf("got %s", mustJSON(t, r))
		}
		cause, _ := r.Error.Details["cause"].(map[string]any)
		if details, _ := cause["details"].(map[string]any); details["e_code"] != api.EBreakerOpen {
			t.Fatalf("skip without its cause: %s", mustJSON(t, r.Error))
		}
	})

	t.Run("tenant hooks: budget exceeded continues, custom condition on success", func(t *testing.T) {
		const tenant = "hkt"
		c := grant(tenant, "*")
		c.Budget = &token.Budget{MaxCalls: 1}
		raw := mint(t, c)
		if r := e.invoke(withTok(request(tenant, "noop", `{}`), raw)); r.Status != api.StatusSuccess {
			t.Fatalf("first call: %s", mustJSON(t, r))
		}
		r := e.invoke(withTok(request(tenant, "noop", `{}`), raw))
		h := hookOf(t, r)
		if r.Error == nil || r.Error.ECode != api.EBudgetExhausted || h.Hook != "overspent" || h.Source != "tenant" || h.Action != "continue" {
			t.Fatalf("overspent call: %s", mustJSON(t, r))
		}
		// The budget hook applies to noop only; echo's success meets the
		// custom hook, whose fallback has its own authorization and budget.
		swap := e.invoke(request(tenant, "echo", `{"message":"swap"}`))
		if swap.Status != api.StatusSuccess || hookOf(t, swap).Hook != "swap" {
			t.Fatalf("swap: %s", mustJSON(t, swap))
		}
		child := wait(tenant, hookOf(t, swap).HandedTo)
		if child.Status != api.StatusSuccess || !strings.Contains(string(child.Result), `"swapped by success"`) {
			t.Fatalf("swapped: %s", mustJSON(t, child))
		}
	})

	t.Run("a forged link is refused", func(t *testing.T) {
		const tenant = "hk9"
		req := request(tenant, "echo", `{"message":"x"}`)
		req.Link = &api.Link{Parent: "someone-else", Root: "someone-else", Hook: "h", Action: "retry", Depth: 1, Attempt: 1}
		expectDenied(t, e.invoke(req), api.StatusPermissionDenied, api.ELinkRefused)
		req.CapabilityToken = ""
		expectDenied(t, e.invoke(req), api.StatusPermissionDenied, api.ELinkRefused)
		// A real decision admits only the child it names, as it was decided.
		if decided.ExecutionMetadata == nil || decided.ExecutionMetadata.Hook == nil {
			t.Skip("no decided invocation")
		}
		forged := request("hk1", "echo", `{"message":"mine"}`)
		forged.CapabilityToken = ""
		forged.Link = &api.Link{Parent: decided.InvocationID, Root: decided.InvocationID, Hook: "to-echo",
			Action: "retry_with_fallback", Depth: 1, Attempt: 1}
		expectDenied(t, e.invoke(forged), api.StatusPermissionDenied, api.ELinkRefused)
	})
}
