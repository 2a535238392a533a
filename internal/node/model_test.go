package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/modelrouter/modeltest"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// TestModelTools invokes model tools through every stage against local
// servers speaking the OpenAI and Anthropic wire formats: answers streamed
// and not, fallback past endpoints that fail, hang and are rate limited, a
// breaker that opens, a request that fits no window, and answers that are
// not the wire format, too large or cut mid-stream, each with its code, its
// audit event and its tokens charged to the session.
func TestModelTools(t *testing.T) {
	const oaiKey, antKey = "sk-test-OPENAI-0123456789", "sk-ant-test-ANTHROPIC-987654"
	oai := modeltest.New(t, "openai")
	oai.Key = oaiKey
	ant := modeltest.New(t, "anthropic")
	ant.Key = antKey
	ant.Answer = "Bonjour from the messages API"
	ant.InputTokens, ant.OutputTokens = 20, 6
	failing := modeltest.New(t, "openai")
	failing.Set(modeltest.Fail500)
	limited := modeltest.New(t, "openai")
	limited.Set(modeltest.Limited)
	hanging := modeltest.New(t, "openai")
	hanging.Set(modeltest.Hang)
	odd := modeltest.New(t, "openai") // behaviour set per case
	servers := []*modeltest.Server{oai, ant, failing, limited, hanging, odd}

	dir := t.TempDir()
	for name, v := range map[string]string{"openai_key": oaiKey, "anthropic_key": antKey} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	e := newEnv(t, topology.TopologyOptions{})
	// The catalogue is in KV before the workers start, so their watch
	// loads it whole.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := kvstore.Open(ctx, e.js, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	models := []string{
		fmt.Sprintf(`{"name":"gpt-small","api":"openai","upstream_model":"gpt-4o-mini","endpoints":[%q],"tier":"small",
		  "context_window":8000,"max_output_tokens":256,"price":{"input_per_1k":0.5,"output_per_1k":1.5},"latency_ms":800,
		  "credential":{"secret":"openai_key"}}`, oai.Base()),
		fmt.Sprintf(`{"name":"claude-medium","api":"anthropic","upstream_model":"claude-sonnet","endpoints":[%q],"tier":"medium",
		  "context_window":200000,"max_output_tokens":512,"price":{"input_per_1k":3,"output_per_1k":15},"latency_ms":3000,
		  "credential":{"secret":"anthropic_key"}}`, ant.Base()),
		fmt.Sprintf(`{"name":"shaky","api":"openai","endpoints":[%q,%q,%q],"tier":"small","context_window":8000,"max_output_tokens":256,
		  "price":{"input_per_1k":0.1,"output_per_1k":0.1},"timeout_ms":300,"fallback":["gpt-small"],
		  "retry":{"max_attempts":2,"base_delay_ms":50},
		  "circuit_breaker":{"failure_rate_threshold":50,"sliding_window_size":4,"minimum_calls":100,"wait_duration_seconds":60}}`,
			failing.Base(), limited.Base(), hanging.Base()),
		fmt.Sprintf(`{"name":"dead","api":"openai","endpoints":[%q],"tier":"small","context_window":8000,"max_output_tokens":256,
		  "price":{"input_per_1k":0.1,"output_per_1k":0.1},"fallback":["gpt-small"],"retry":{"max_attempts":1},
		  "circuit_breaker":{"failure_rate_threshold":50,"sliding_window_size":2,"minimum_calls":2,"wait_duration_seconds":60}}`, failing.Base()),
		fmt.Sprintf(`{"name":"tiny","api":"openai","endpoints":[%q],"tier":"small","context_window":300,"max_output_tokens":50,
		  "price":{"input_per_1k":0.1,"output_per_1k":0.1}}`, odd.Base()),
		fmt.Sprintf(`{"name":"odd","api":"openai","endpoints":[%q],"tier":"large","context_window":1000,"max_output_tokens":100,
		  "price":{"input_per_1k":1,"output_per_1k":1}}`, odd.Base()),
	}
	for _, doc := range models {
		if _, err := store.PutModel(ctx, []byte(doc)); err != nil {
			t.Fatal(err)
		}
	}
	n := e.startPipeline(node.Config{Stage: node.StageConfig{SecretsDir: dir}})
	registerTools(t, n, `{"id":"test.llm","name":"llm","version":"1.0.0","description":"asks a model","kind":"model",
	  "model":{"policy":"cost-first","max_response_bytes":65536},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object","required":["content"]},
	  "permissions":{"network":[{"host":"127.0.0.1"}],"credentials":["openai_key","anthropic_key"]},
	  "safety":{"idempotent":true},"limits":{"timeout_ms":20000}}`)
	var ports []int
	for _, s := range servers {
		u, _ := url.Parse(s.URL)
		p, _ := strconv.Atoi(u.Port())
		ports = append(ports, p)
	}
	registerTools(t, n, `{"id":"test.llm_small","name":"llm (small windows)","version":"1.0.0","description":"asks a small model",
	  "kind":"model","model":{"models":["tiny","gpt-small","odd"]},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "permissions":{"network":[{"host":"127.0.0.1"}]}}`)
	maxTokens := int64(100000)
	callTool := func(t *testing.T, tool, tenant, params string) api.Response {
		t.Helper()
		c := grant(tenant, tool)
		c.SessionID = "s-" + tenant
		c.ID = "tree-" + tenant // one token tree per tenant: its budget accumulates
		c.Network = &token.NetworkGrant{AllowedHosts: []string{"127.0.0.1"}, AllowedPorts: ports}
		c.Credentials = &token.CredentialGrant{AllowedSecrets: []string{"openai_key", "anthropic_key"}}
		c.Budget = &token.Budget{MaxTokens: maxTokens}
		req := withTok(request(tenant, tool, params), mint(t, c))
		req.AgentContext.SessionID = c.SessionID
		return e.invoke(req)
	}
	call := func(t *testing.T, tenant, params string) api.Response { return callTool(t, "test.llm", tenant, params) }
	charged := func(t *testing.T, tenant string) int64 {
		t.Helper()
		var u kvstore.Usage
		eventually(t, 10*time.Second, "usage charged", func() bool {
			u, err = n.Store.Usage(ctx, tenant, token.BudgetKey("tree-"+tenant))
			return err == nil && len(u.Settled) > 0
		})
		return u.Tokens
	}
	// terminal returns the model record of the tenant's terminal audit
	// event, which must be of type typ.
	terminal := func(t *testing.T, tenant string, typ string) *api.ModelUse {
		t.Helper()
		var msgs []jetstream.Msg
		eventually(t, 10*time.Second, "terminal audit event", func() bool {
			msgs = e.read(subjects.StreamAudit, subjects.AuditTenant(tenant), e.count(subjects.StreamAudit, subjects.AuditTenant(tenant)), 5*time.Second)
			return len(msgs) > 0 && !strings.HasSuffix(msgs[len(msgs)-1].Subject(), "invoked")
		})
		last := msgs[len(msgs)-1]
		if !strings.HasSuffix(last.Subject(), envelope.SubjectSuffix(typ)) {
			t.Fatalf("terminal audit event on %s, want type %s", last.Subject(), typ)
		}
		var ev struct {
			Data struct {
				Metadata *api.ExecutionMetadata `json:"execution_metadata"`
			} `json:"data"`
		}
		if err := json.Unmarshal(last.Data(), &ev); err != nil || ev.Data.Metadata == nil || ev.Data.Metadata.Model == nil {
			t.Fatalf("audit event without model metadata: %v %s", err, last.Data())
		}
		for _, m := range msgs {
			for _, secret := range []string{oaiKey, antKey} {
				if strings.Contains(string(m.Data()), secret) {
					t.Fatalf("audit event holds a credential: %s", m.Data())
				}
			}
		}
		return ev.Data.Metadata.Model
	}
	result := func(t *testing.T, resp api.Response) map[string]any {
		t.Helper()
		if resp.Status != api.StatusSuccess {
			t.Fatalf("got %s %s", resp.Status, mustJSON(t, resp.Error))
		}
		var r map[string]any
		if err := json.Unmarshal(resp.Result, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	failed := func(t *testing.T, resp api.Response, ecode string) {
		t.Helper()
		if resp.Status == api.StatusSuccess || resp.Error == nil || resp.Error.ECode != ecode {
			t.Fatalf("got %s %s, want %s", resp.Status, mustJSON(t, resp.Error), ecode)
		}
	}

	run := func(name string, f func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			e.t = t
			f(t)
		})
	}
	run("openai by name", func(t *testing.T) {
		r := result(t, call(t, "m1", `{"model":"gpt-small","prompt":"Say hello"}`))
		if r["content"] != "Hello from openai" || r["model"] != "gpt-small" {
			t.Fatalf("result %v", r)
		}
		if got := oai.Last()["model"]; got != "gpt-4o-mini" {
			t.Fatalf("upstream model %v", got)
		}
		mu := terminal(t, "m1", api.TypeSucceeded)
		if mu.InputTokens != 12 || mu.OutputTokens != 4 || mu.Routing.Chosen != "gpt-small" {
			t.Fatalf("model use %s", mustJSON(t, mu))
		}
		if got := charged(t, "m1"); got != 16 {
			t.Fatalf("session charged %d tokens, want 16", got)
		}
	})
	run("anthropic streamed, routed by tier", func(t *testing.T) {
		r := result(t, call(t, "m2", `{"tier":"medium","stream":true,"system":"be brief","messages":[{"role":"user","content":"Greet me"}]}`))
		if r["content"] != ant.Answer || r["model"] != "claude-medium" {
			t.Fatalf("result %v", r)
		}
		if ant.Last()["stream"] != true || ant.Last()["system"] != "be brief" {
			t.Fatalf("request %v", ant.Last())
		}
		if got := charged(t, "m2"); got != 26 {
			t.Fatalf("session charged %d tokens, want 26", got)
		}
	})
	run("openai streamed", func(t *testing.T) {
		r := result(t, call(t, "m3", `{"model":"gpt-small","stream":true,"prompt":"hi"}`))
		if r["content"] != "Hello from openai" {
			t.Fatalf("result %v", r)
		}
	})
	run("fallback past 5xx, 429 and a hang, after a retry", func(t *testing.T) {
		r := result(t, call(t, "m4", `{"model":"shaky","prompt":"hi"}`))
		if r["model"] != "gpt-small" {
			t.Fatalf("answered by %v", r["model"])
		}
		mu := terminal(t, "m4", api.TypeSucceeded)
		var codes []string
		for _, a := range mu.Attempts {
			codes = append(codes, a.ECode)
		}
		got := strings.Join(codes, ",")
		// The round-robin start varies; each failure is seen once in each
		// of the model's two rounds, then the fallback answers.
		for _, want := range []string{api.EExternalStatus, api.ERateLimited, api.ETimeout} {
			if strings.Count(got, want) != 2 {
				t.Fatalf("attempts %s: %s not twice", got, want)
			}
		}
		if !strings.HasSuffix(got, ",") || len(codes) != 7 {
			t.Fatalf("attempts %s", got)
		}
	})
	run("breaker opens and the chain moves on", func(t *testing.T) {
		for i := range 2 {
			result(t, call(t, fmt.Sprintf("m5%d", i), `{"model":"dead","prompt":"hi"}`))
		}
		before := failing.Calls()
		result(t, call(t, "m52", `{"model":"dead","prompt":"hi"}`))
		if failing.Calls() != before {
			t.Fatal("the open breaker let a call through")
		}
		mu := terminal(t, "m52", api.TypeSucceeded)
		if mu.Attempts[0].ECode != api.EBreakerOpen || mu.Model != "gpt-small" {
			t.Fatalf("attempts %s", mustJSON(t, mu))
		}
	})
	run("unknown model", func(t *testing.T) {
		failed(t, call(t, "m6", `{"model":"no-such-model","prompt":"hi"}`), api.EModelUnknown)
		terminal(t, "m6", api.TypeFailed)
	})
	run("fits no context window", func(t *testing.T) {
		var big []string
		for i := range 20 {
			big = append(big, fmt.Sprintf(`{"role":"user","content":"%d %s"}`, i, strings.Repeat("lorem ipsum dolor sit amet ", 110)))
		}
		failed(t, callTool(t, "test.llm_small", "m7", fmt.Sprintf(`{"messages":[%s]}`, strings.Join(big, ","))), api.EModelContextWindow)
		terminal(t, "m7", api.TypeFailed)
	})
	run("routed up to a larger window, and truncated when allowed", func(t *testing.T) {
		odd.Set(modeltest.OK)
		msgs := []string{}
		for i := range 30 {
			msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":"message %d %s"}`, i, strings.Repeat("word ", 40)))
		}
		params := fmt.Sprintf(`{"tier":"small","messages":[%s]}`, strings.Join(msgs, ","))
		// tiny's window is too small; the small models that fit are tried
		// cheapest first (dead's breaker is open, shaky fails), then gpt-small.
		r := result(t, call(t, "m8", params))
		if r["model"] != "gpt-small" {
			t.Fatalf("answered by %v", r["model"])
		}
		mu := terminal(t, "m8", api.TypeSucceeded)
		if !slices.ContainsFunc(mu.Routing.Considered, func(c api.Candidate) bool {
			return c.Model == "tiny" && strings.HasPrefix(c.Reason, "context window")
		}) || slices.Contains(mu.Routing.Chain, "tiny") {
			t.Fatalf("routing %s", mustJSON(t, mu.Routing))
		}
		// Only tiny allowed by name: it does not fit, and truncation makes it fit.
		failed(t, call(t, "m81", fmt.Sprintf(`{"model":"tiny","messages":[%s]}`, strings.Join(msgs, ","))), api.EModelContextWindow)
		result(t, call(t, "m82", fmt.Sprintf(`{"model":"tiny","truncate":"drop_oldest","messages":[%s]}`, strings.Join(msgs, ","))))
		mu = terminal(t, "m82", api.TypeSucceeded)
		if mu.Routing.Truncated != "drop_oldest" || mu.Routing.InputTokens > 250 {
			t.Fatalf("routing %s", mustJSON(t, mu.Routing))
		}
		if sent := odd.Last()["messages"].([]any); len(sent) >= 30 || !strings.Contains(fmt.Sprint(sent[len(sent)-1]), "message 29") {
			t.Fatalf("sent %d messages, the last %v", len(sent), sent[len(sent)-1])
		}
	})
	run("answer not in the wire format", func(t *testing.T) {
		odd.Set(modeltest.Garbage)
		failed(t, call(t, "m9", `{"model":"odd","prompt":"hi"}`), api.EModelMalformed)
		if mu := terminal(t, "m9", api.TypeFailed); mu.InputTokens == 0 {
			t.Fatalf("input not charged: %s", mustJSON(t, mu))
		}
		if got := charged(t, "m9"); got == 0 {
			t.Fatal("no tokens charged")
		}
	})
	run("oversized answer", func(t *testing.T) {
		odd.Set(modeltest.Huge)
		failed(t, call(t, "m10", `{"model":"odd","prompt":"hi"}`), api.EModelAnswerTooLarge)
		terminal(t, "m10", api.TypeFailed)
	})
	run("stream stops mid-way", func(t *testing.T) {
		odd.Set(modeltest.Cut)
		odd.Answer = "one two three four five six"
		failed(t, call(t, "m11", `{"model":"odd","stream":true,"prompt":"count"}`), api.EModelStreamCut)
		mu := terminal(t, "m11", api.TypeFailed)
		if mu.OutputTokens == 0 || mu.InputTokens == 0 {
			t.Fatalf("partial use not charged: %s", mustJSON(t, mu))
		}
		if got := charged(t, "m11"); got != mu.Tokens() {
			t.Fatalf("session charged %d, the call used %d", got, mu.Tokens())
		}
	})
	run("a secret in the answer is redacted", func(t *testing.T) {
		odd.Set(modeltest.OK)
		odd.Answer = "the key is AKIAQ4NB7XWZ3RTK2M5H, keep it"
		resp := call(t, "m12", `{"model":"odd","prompt":"leak"}`)
		res := string(resp.Result)
		if resp.Status != api.StatusSuccess || strings.Contains(res, "AKIAQ4NB7XWZ3RTK2M5H") || !strings.Contains(res, "[REDACTED:") {
			t.Fatalf("got %s %s", resp.Status, res)
		}
	})
	run("an operator's routing policy", func(t *testing.T) {
		// Cost first (the default) tries the cheap small models first; a
		// policy stored in KV that puts the slowest first picks gpt-small
		// (800 ms; the others declare no latency) without a restart.
		slowest := `package toolgate.routing
order := [x[1] | some x in sort([[0 - c.latency_ms, c.name] | some c in input.candidates])]`
		if err := n.Store.PutRoutingPolicy(ctx, []byte("package toolgate.routing\norder := http.send({})")); err == nil {
			t.Fatal("a policy calling http.send was stored")
		}
		if err := n.Store.PutRoutingPolicy(ctx, []byte(slowest)); err != nil {
			t.Fatal(err)
		}
		var tries int
		eventually(t, 15*time.Second, "the policy in use", func() bool {
			tries++
			resp := call(t, fmt.Sprintf("m13%d", tries), `{"tier":"small","prompt":"hi"}`)
			var r map[string]any
			_ = json.Unmarshal(resp.Result, &r)
			return resp.Status == api.StatusSuccess && r["model"] == "gpt-small" &&
				!strings.Contains(mustJSON(t, resp.ExecutionMetadata.Model.Attempts), "shaky")
		})
		if err := n.Store.PutRoutingPolicy(ctx, nil); err != nil {
			t.Fatal(err)
		}
	})
	// A model call holds what the budget leaves before it runs and asks
	// the provider for no more than fits (the prompt counted at a byte a
	// token), so a budget is never passed however long the answers: with
	// check-then-charge the provider's 12+40 tokens a call made the second
	// call use 104 of 60.
	run("max_tokens budget spent by model calls", func(t *testing.T) {
		maxTokens = 60
		oai.SetUsage(12, 40)
		defer func() { maxTokens = 100000; oai.SetUsage(12, 4) }()
		// "hi" counts 30 at worst: the first call may answer 30 tokens.
		result(t, call(t, "m14", `{"model":"gpt-small","prompt":"hi"}`))
		if got := oai.Last()["max_tokens"]; got != float64(30) {
			t.Fatalf("the first call asked for max_tokens %v, want 30 (60 less the prompt's worst)", got)
		}
		for range 2 {
			resp := call(t, "m14", `{"model":"gpt-small","prompt":"hi"}`)
			if resp.Status == api.StatusSuccess || resp.Error == nil || resp.Error.ECode != api.EBudgetExhausted {
				t.Fatalf("got %s %s, want %s", resp.Status, mustJSON(t, resp.Error), api.EBudgetExhausted)
			}
		}
		if u, err := n.Store.Usage(ctx, "m14", token.BudgetKey("tree-m14")); err != nil || u.Tokens != 42 || u.Tokens > 60 || len(u.Holds) != 0 {
			t.Fatalf("usage %+v %v, want 42 of 60 tokens and no holds left", u, err)
		}
		st, err := e.client.Budget(ctx, "m14", token.BudgetKey("tree-m14"), api.BudgetLimits{MaxTokens: 60, MaxCalls: 10})
		if err != nil || st.Used.Tokens != 42 || st.Remaining["tokens"] != 18 || st.PerHour["tokens"] <= 0 {
			t.Fatalf("budget status %s %v", mustJSON(t, st), err)
		}
	})
}
