package node_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/ratelimit"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// ratedTool is a noop whose rate limit admits burst calls an hour: slow
// enough that each call takes its own token from the shared bucket.
func ratedTool(id string, burst int, extra string) string {
	return fmt.Sprintf(`{"id":%q,"name":"rated","version":"1.0.0","description":"a slow rate limit","kind":"builtin",
	  "builtin":{"function":"noop"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "rate_limit":{"requests":%d,"per_seconds":3600,"burst":%d}%s}`, id, burst, burst, extra)
}

// bucketOf reads the rate-limit bucket of tenant and tool.
func bucketOf(t *testing.T, n *node.Node, tenant, tool string) kvstore.Bucket {
	t.Helper()
	b, err := n.Store.UpdateBucket(context.Background(), tenant, tool, func(*kvstore.Bucket, bool) error { return kvstore.ErrUnchanged })
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// budgetToken mints a token of tenant's own session under b, and returns
// it with its budget key.
func budgetToken(t *testing.T, tenant string, b token.Budget) (raw, key string) {
	t.Helper()
	c := grant(tenant, "*")
	c.SessionID = "s-" + tenant
	c.Budget = &b
	raw = mint(t, c)
	vc, err := testVerifier().Verify(raw)
	if err != nil {
		t.Fatal(err)
	}
	return raw, token.BudgetKey(vc.ID)
}

// TestRedriveChargesOnce: calls admitted and routed, waiting for execute in
// a hand-off in memory, are lost with the server and re-driven from their
// ingest through authorize and route again. Each must still be charged
// once to its session's budget and take one token of its tool's rate
// limit: with both sized to the calls exactly, a second charge refuses
// calls that were admitted. One session's budget is judged call by call
// (it caps runtime too), the other's caps only calls and is leased.
func TestRedriveChargesOnce(t *testing.T) {
	const calls = 70
	e, restart := newEnvAt(t, topology.TopologyOptions{MemoryHops: true}, fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	// No execute: every call waits in the hand-off to it.
	first, stop := e.runPipeline(node.Config{Stages: []string{subjects.Validate, subjects.Authorize, subjects.Route,
		subjects.Verify, subjects.Audit, node.Control}})
	registerTools(t, first, ratedTool("test.rated", calls, ""))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	type session struct {
		tenant, key string
		ids         []string
	}
	var sessions []*session
	for tenant, b := range map[string]token.Budget{
		"chgcas":   {MaxCalls: calls, MaxRuntimeMS: 3_600_000},
		"chglease": {MaxCalls: calls},
	} {
		raw, key := budgetToken(t, tenant, b)
		s := &session{tenant: tenant, key: key}
		req := withTok(request(tenant, "test.rated", `{}`), raw)
		req.AgentContext.SessionID = "s-" + tenant
		for range calls {
			id, err := e.client.Invoke(ctx, req, clientOpts(""))
			if err != nil {
				t.Fatal(err)
			}
			s.ids = append(s.ids, id)
		}
		sessions = append(sessions, s)
	}
	eventually(t, time.Minute, "every call routed and waiting for execute", func() bool {
		return e.count(subjects.StreamPipeline, subjects.Pipe(subjects.Execute, "", "*")) == 2*calls
	})
	for _, s := range sessions {
		if u, err := first.Store.Usage(ctx, s.tenant, s.key); err != nil || u.Calls != calls {
			t.Fatalf("%s before the restart: usage %+v, %v; want %d calls", s.tenant, u, err, calls)
		}
	}
	stop()
	restart()
	n, _ := e.runPipeline(node.Config{})

	for _, s := range sessions {
		for _, id := range s.ids {
			resp, err := e.client.Wait(ctx, s.tenant, id)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Status != api.StatusSuccess {
				t.Fatalf("%s: re-driven call %s ended %s %s: charged again", s.tenant, id, resp.Status, mustJSON(t, resp.Error))
			}
		}
		u, err := n.Store.Usage(ctx, s.tenant, s.key)
		if err != nil || u.Calls != calls {
			t.Errorf("%s: usage %+v, %v; want %d calls, each charged once", s.tenant, u, err, calls)
		}
		// The bucket held one token a call; an hour's refill of that many
		// adds well under one in the test's time.
		if b := bucketOf(t, n, s.tenant, "test.rated"); b.Tokens < 0 || b.Tokens >= 1 {
			t.Errorf("%s: the rate-limit bucket holds %.2f tokens after %d calls of a burst of %d", s.tenant, b.Tokens, calls, calls)
		}
	}
}

// TestRefusedCallsCostNothing: a call refused after authorize reserved it,
// before its tool ran (at route over the rate limit, E3303; at execute
// with as many calls running as the agent may, E3106), gives its call
// back to the session's budget: only calls that ran are charged.
func TestRefusedCallsCostNothing(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{})
	registerTools(t, n, ratedTool("test.rated1", 1, `,"cost":{"per_call":0.25}`),
		`{"id":"test.hold1","name":"hold one","version":"1.0.0","description":"holds; one call at a time per agent","kind":"builtin",
		  "builtin":{"function":"hold"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
		  "limits":{"concurrent_per_agent":1}}`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for tenant, b := range map[string]token.Budget{
		"refcas":   {MaxCalls: 10, MaxRuntimeMS: 3_600_000},
		"reflease": {MaxCalls: 10},
	} {
		raw, key := budgetToken(t, tenant, b)
		call := func(tool string) api.Response {
			req := withTok(request(tenant, tool, `{}`), raw)
			req.AgentContext.SessionID = "s-" + tenant
			return e.invoke(req)
		}
		if r := call("test.rated1"); r.Status != api.StatusSuccess {
			t.Fatalf("%s: first call %s %s", tenant, r.Status, mustJSON(t, r.Error))
		}
		for range 2 {
			expectDenied(t, call("test.rated1"), api.StatusError, api.ERateLimited)
		}
		// One call holds the agent's only run; the next is refused at execute.
		params := fmt.Sprintf(`{"tenant":%q}`, tenant)
		req := withTok(request(tenant, "test.hold1", params), raw)
		req.AgentContext.SessionID = "s-" + tenant
		if _, err := e.client.Invoke(ctx, req, clientOpts("")); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "the held call running", func() bool { return e.holdingOf(params).Load() == 1 })
		expectDenied(t, call("test.hold1"), api.StatusError, api.EConcurrentLimit)
		u, err := n.Store.Usage(ctx, tenant, key)
		// Two calls ran or run; the three refused cost nothing.
		if err != nil || u.Calls != 2 || u.Cost != 0.25 {
			t.Errorf("%s: usage %+v, %v; want 2 calls (one running) and 0.25 of cost", tenant, u, err)
		}
	}
	e.release()
}

// TestRateLimitRefusalNamesItsLimit: a call over a rate limit is told which
// limit it is over and whose it is: the manifest's, shared by the tenant's
// agents, or the default for each agent where the manifest declares none
// (what a tool meant to be driven fast meets while the manifest that
// declares its rate is not the one route holds).
func TestRateLimitRefusalNamesItsLimit(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{Stage: node.StageConfig{TenantDefaults: map[string]tools.Defaults{
		"rldef": {RateLimit: &tools.RateLimit{Requests: 1, PerSeconds: 3600}},
	}}})
	registerTools(t, n, ratedTool("test.rated2", 1, ""),
		`{"id":"test.silent","name":"silent","version":"1.0.0","description":"declares no rate limit","kind":"builtin",
		  "builtin":{"function":"noop"},"input_schema":{"type":"object"},"output_schema":{"type":"object"}}`)
	for _, c := range []struct {
		tenant, tool, source, says string
		requests, per, burst       int
	}{
		{"rlman", "test.rated2", ratelimit.SourceManifest, "1 per 3600 s, burst 1, its manifest's", 1, 3600, 1},
		{"rldef", "test.silent", ratelimit.SourceDefault, "1 per 3600 s, burst 1, the default for each agent, as its manifest declares none", 1, 3600, 1},
	} {
		if r := e.invoke(request(c.tenant, c.tool, `{}`)); r.Status != api.StatusSuccess {
			t.Fatalf("%s: first call %s %s", c.tenant, r.Status, mustJSON(t, r.Error))
		}
		r := e.invoke(request(c.tenant, c.tool, `{}`))
		expectDenied(t, r, api.StatusError, api.ERateLimited)
		lim, _ := r.Error.Details["rate_limit"].(map[string]any)
		if !strings.Contains(r.Error.Message, c.says) || lim["source"] != c.source ||
			fmt.Sprint(lim["requests"], lim["per_seconds"], lim["burst"]) != fmt.Sprint(c.requests, c.per, c.burst) {
			t.Errorf("%s: refusal %q, details %v: want it to say %q, from %s", c.tenant, r.Error.Message, r.Error.Details, c.says, c.source)
		}
	}
}
