package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/internal/topology"
)

// Tools that declare nothing but what they are: the defaults decide the rest.
var silentTools = []string{
	`{"id":"sd.slow","name":"slow","version":"1.0.0","description":"sleeps","kind":"builtin","builtin":{"function":"sleep"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"}}`,
	`{"id":"sd.quick","name":"quick","version":"1.0.0","description":"no-op, any number at once","kind":"builtin","builtin":{"function":"noop"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},"limits":{"concurrent_per_agent":100000}}`,
	`{"id":"sd.maybe","name":"maybe","version":"1.0.0","description":"fails when asked","kind":"builtin","builtin":{"function":"maybe"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},"rate_limit":{"requests":1000,"per_seconds":1}}`,
	`{"id":"sd.flaky","name":"flaky","version":"1.0.0","description":"fails twice","kind":"builtin","builtin":{"function":"flaky"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},"safety":{"idempotent":true}}`,
	`{"id":"sd.flaky_unsafe","name":"flaky unsafe","version":"1.0.0","description":"fails twice","kind":"builtin","builtin":{"function":"flaky"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"}}`,
}

// fire sends n calls of req at once and returns their responses.
func (e *env) fire(req api.Request, n int) []api.Response {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := make([]string, n)
	for i := range ids {
		id, err := e.client.Invoke(ctx, req, clientOpts(""))
		if err != nil {
			e.t.Fatal(err)
		}
		ids[i] = id
	}
	out := make([]api.Response, n)
	for i, id := range ids {
		resp, err := e.client.Wait(ctx, req.AgentContext.TenantID, id)
		if err != nil {
			e.t.Fatal(err)
		}
		out[i] = resp
	}
	return out
}

// tally counts successes and failures by E-code.
func tally(rs []api.Response) (ok int, by map[string]int) {
	by = map[string]int{}
	for _, r := range rs {
		if r.Status == api.StatusSuccess {
			ok++
		} else if r.Error != nil {
			by[r.Error.ECode]++
		}
	}
	return ok, by
}

// TestSeedDefaultLimits: where a manifest is silent, the specification's
// defaults hold: 4 calls running per agent (E3106, refused, not queued;
// the slot is freed when a call ends, and a dead worker's slot lapses), 60
// calls a minute per agent and tool with a tenant's own default replacing
// it, a breaker at 50 failures of the last 100 calls, and 3 attempts for an idempotent tool.
func TestSeedDefaultLimits(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{Workers: 12, Stage: node.StageConfig{Defaults: tools.SeedDefaults(),
		TenantDefaults: map[string]tools.Defaults{"bulk": {RateLimit: &tools.RateLimit{Requests: 100_000, PerSeconds: 1}}}}})
	registerTools(t, n, silentTools...)

	t.Run("four running per agent", func(t *testing.T) {
		ok, by := tally(e.fire(request("conc", "sd.slow", `{"ms":2500}`), 7))
		if ok != 4 || by[api.EConcurrentLimit] != 3 {
			t.Fatalf("%d ran, refused %v; want 4 and 3 E3106", ok, by)
		}
		// Every slot was given back: four more run.
		if ok, by := tally(e.fire(request("conc", "sd.slow", `{"ms":300}`), 4)); ok != 4 {
			t.Fatalf("after the first ended: %d ran, %v", ok, by)
		}
		resp := e.fire(request("conc", "sd.slow", `{"ms":2500}`), 5)
		var refused *api.Error
		for _, r := range resp {
			if r.Error != nil && r.Error.ECode == api.EConcurrentLimit {
				refused = r.Error
			}
		}
		if refused == nil || refused.Code != api.RateLimitExceeded || !refused.Retryable ||
			fmt.Sprint(refused.Details["limit"]) != "4" || refused.Details["retry_after_ms"] == nil {
			t.Fatalf("refusal: %+v", refused)
		}
	})

	t.Run("a dead worker's slots lapse", func(t *testing.T) {
		ctx := context.Background()
		// Four calls claimed by a worker that then died: nobody releases them.
		for i := range 4 {
			if held, _, err := n.Store.ClaimAgentRun(ctx, "lapse", "did:agent:test", fmt.Sprint("ghost-", i), 4, time.Now(), 1500*time.Millisecond); err != nil || !held {
				t.Fatalf("ghost %d: held %v, %v", i, held, err)
			}
		}
		if r := e.invoke(request("lapse", "sd.slow", `{"ms":1}`)); r.Error == nil || r.Error.ECode != api.EConcurrentLimit {
			t.Fatalf("with four leases held: %+v", r)
		}
		time.Sleep(1600 * time.Millisecond)
		if r := e.invoke(request("lapse", "sd.slow", `{"ms":1}`)); r.Status != api.StatusSuccess {
			t.Fatalf("after the leases lapsed: %+v", r.Error)
		}
	})

	t.Run("sixty a minute per agent and tool", func(t *testing.T) {
		ok, by := tally(e.fire(request("rate", "sd.quick", `{}`), 75))
		// A full bucket of 60, refilling one a second while they arrive:
		// all 60 and a few refilled run, the rest are refused.
		if ok < 60 || ok > 66 || by[api.ERateLimited] != 75-ok {
			t.Fatalf("%d ran, refused %v; want the 60 of the bucket and a few refilled, the rest E3303", ok, by)
		}
		other := request("rate", "sd.quick", `{}`)
		other.AgentContext.AgentDID, other.CapabilityToken = "did:agent:other", tokenFor("rate", "did:agent:other")
		if r := e.invoke(other); r.Status != api.StatusSuccess {
			t.Fatalf("another agent of the tenant: %+v", r.Error)
		}
		// The tenant's own default replaces the specification's.
		if ok, by := tally(e.fire(request("bulk", "sd.quick", `{}`), 75)); ok != 75 {
			t.Fatalf("tenant bulk: %d ran, %v", ok, by)
		}
	})

	t.Run("a breaker at half the window failing", func(t *testing.T) {
		// Count-based, the breaker opens at 50 failures of the last 100
		// calls (minimum_calls counts for a time-based window).
		for i := range 50 {
			if r := e.invoke(request("brk", "sd.maybe", `{"fail":true}`)); r.Error == nil || r.Error.ECode != api.EToolFailed {
				t.Fatalf("failure %d: %+v", i, r)
			}
		}
		if r := e.invoke(request("brk", "sd.maybe", `{}`)); r.Error == nil || r.Error.ECode != api.EBreakerOpen {
			t.Fatalf("after fifty failures: %+v", r)
		}
	})

	t.Run("three attempts for an idempotent tool", func(t *testing.T) {
		r := e.invoke(request("retry", "sd.flaky", `{"n":1}`))
		if r.Status != api.StatusSuccess || r.ExecutionMetadata.Attempts != 3 {
			t.Fatalf("idempotent: %+v attempts %d", r.Error, r.ExecutionMetadata.Attempts)
		}
		r = e.invoke(request("retry", "sd.flaky_unsafe", `{"n":2}`))
		if r.Status != api.StatusError || r.ExecutionMetadata.Attempts != 1 {
			t.Fatalf("not idempotent: %+v attempts %d", r.Error, r.ExecutionMetadata.Attempts)
		}
	})
}
