package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/connect"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/kvstore"
)

// asMain makes the test binary the toolgate command, so a test can run it as
// a separate process (a desktop MCP client launching `toolgate mcp --stdio`)
// without building it.
const asMain = "TOOLGATE_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMain) == "1" {
		main()
	}
	os.Exit(m.Run())
}

// toolgateCmd is the command line run as the toolgate binary in dir, with
// exactly env as its environment (nothing of the test's).
func toolgateCmd(t *testing.T, dir string, env []string, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Dir = dir
	cmd.Env = append([]string{asMain + "=1", "PATH=" + os.Getenv("PATH"), "HOME=" + dir}, env...)
	return cmd
}

// agentToken is a token of the server's development key for an agent of
// tenant demo, granting tools.
func agentToken(t *testing.T, s server, jti string, ttl time.Duration, tools ...string) string {
	t.Helper()
	k, err := token.LoadSigningKey(filepath.Join(s.data, "dev-signing-key.jwk"))
	if err != nil {
		t.Fatal(err)
	}
	return mintFor(t, k, node.DevAgent, jti, ttl, false, tools...)
}

// mintFor is a token signed by k for agent of tenant demo, granting tools;
// reader makes it a tenant reader's.
func mintFor(t *testing.T, k *token.SigningKey, agent, jti string, ttl time.Duration, reader bool, tools ...string) string {
	t.Helper()
	raw, err := token.Mint(k, token.Claims{
		ToolID: token.Patterns(tools), TenantID: "demo", AgentDID: agent, AllowedOperations: []string{token.OperationExecute},
		TenantReader: reader,
		RegisteredClaims: jwt.RegisteredClaims{Issuer: "toolgate", Audience: jwt.ClaimStrings{"toolgate"}, Subject: agent,
			ID: jti, IssuedAt: jwt.NewNumericDate(time.Now()), ExpiresAt: jwt.NewNumericDate(time.Now().Add(ttl))},
	})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// registerApprovalTool registers tool id, whose every call waits for a
// human's approval, on s as its operator.
func registerApprovalTool(t *testing.T, s server, id string) {
	t.Helper()
	man := initManifest(id)
	man["safety"].(map[string]any)["requires_approval"] = true
	man["input_schema"] = map[string]any{"type": "object"}
	doc, _ := json.Marshal(man)
	if r := tg(t, string(doc), s.flags("tools", "register", "-")...); r.code != exitOK {
		t.Fatalf("register %s: %d %s", id, r.code, r.stderr)
	}
}

// TestMCPStdioAsAgent: `toolgate mcp --stdio` launched as a desktop client
// launches it (from a directory outside the repository, with only the
// agent's token in its environment) lists the tools the token grants and
// calls one; the registry is read through the tenant's own endpoints.
func TestMCPStdioAsAgent(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	tok := agentToken(t, s, "mcp-agent", time.Hour, "echo", "math.*")
	dir := t.TempDir()
	cmd := toolgateCmd(t, dir, []string{"TOOLGATE_TOKEN=" + tok}, "mcp", "--stdio", "--nats", s.url, "--log-level", "warn")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "desktop", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connecting: %v\n%s", err, stderr.String())
	}
	defer cs.Close()
	lr, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v\n%s", err, stderr.String())
	}
	var names []string
	for _, tl := range lr.Tools {
		names = append(names, tl.Name)
	}
	if !slices.Contains(names, "echo") || !slices.Contains(names, "math.eval") || slices.Contains(names, "fs.read_file") {
		t.Fatalf("tools/list shows %v; want echo and math.eval, not fs.read_file", names)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"message": "from an agent"}})
	if err != nil || res.IsError {
		t.Fatalf("tools/call echo: %v %+v\n%s", err, res, stderr.String())
	}
	if got := res.Content[0].(*mcp.TextContent).Text; !strings.Contains(got, "from an agent") {
		t.Fatalf("echo answered %q", got)
	}
}

// TestCommandsByRole runs the commands an agent reaches for as an agent
// (only its token), as an operator and as a worker (which calls no control
// endpoint): each works, or is refused within 5 s with a message naming
// the missing right and its own exit status.
func TestCommandsByRole(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	registerApprovalTool(t, s, "needs.human")
	tok := agentToken(t, s, "roles-agent", time.Hour, "echo", "needs.human")
	asAgent := func(args ...string) []string { return append(args, "--nats", s.url, "--token", tok) }
	asOperator := func(args ...string) []string { return s.flags(args...) }
	// A stage's credentials: one stage's own where each stage has its
	// role, else the workers' shared one.
	stageCreds := filepath.Join(s.data, "busauth", "validate.creds")
	if !fileExists(stageCreds) {
		stageCreds = filepath.Join(s.data, "busauth", "worker.creds")
	}
	asWorker := func(args ...string) []string { return append(s.flags(args...), "--creds", stageCreds) }

	r := tg(t, "", asAgent("invoke", "echo", "--params", `{"message":"hi"}`, "--wait", "--json")...)
	var done api.Response
	if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &done) != nil {
		t.Fatalf("invoke as agent: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = tg(t, "", asAgent("invoke", "needs.human", "--params", `{}`, "--async", "--json")...)
	var parked api.Response
	if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &parked) != nil {
		t.Fatalf("async invoke as agent: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if parked.PollingInfo == nil || parked.PollingInfo.StatusSubject != "tool.svc.demo.status" {
		t.Fatalf("polling_info %+v: want the tenant's own status subject", parked.PollingInfo)
	}
	waitFor(t, "the approval request", func() bool {
		return strings.Contains(tg(t, "", asAgent("status", parked.InvocationID)...).stdout, "pending approval")
	})

	type want struct {
		code int
		out  string // in stdout when it works, in stderr when refused
	}
	cases := []struct {
		args            []string
		agent, operator want
	}{
		{[]string{"tools", "list"}, want{exitOK, "needs.human"}, want{exitOK, "needs.human"}},
		{[]string{"tools", "get", "echo"}, want{exitOK, `"id": "echo"`}, want{exitOK, `"id": "echo"`}},
		{[]string{"approvals", "list"}, want{exitOK, parked.InvocationID}, want{exitOK, parked.InvocationID}},
		{[]string{"approvals", "show", parked.InvocationID}, want{exitOK, "pending"}, want{exitOK, "pending"}},
		{[]string{"budgets", "show"}, want{exitOK, `"tenant": "demo"`}, want{exitOK, `"tenant": "demo"`}},
		{[]string{"status", done.InvocationID}, want{exitOK, "success"}, want{exitOK, "success"}},
		{[]string{"status", parked.InvocationID}, want{exitOK, "waiting for a human"}, want{exitOK, "toolgate approve " + parked.InvocationID}},
		{[]string{"status", done.InvocationID, "--tenant", "other"}, want{exitWrongTenant, "tenant demo"}, want{exitError, "E3025"}},
		{[]string{"breakers"}, want{exitNotPermitted, "tool.svc.breakers.list"}, want{exitOK, "KEY"}},
		{[]string{"redrive", "list", "--tenant", "demo"}, want{exitNotPermitted, "tool.svc.redrive.list"}, want{exitOK, "INVOCATION"}},
		{[]string{"audit", "history"}, want{exitOK, parked.InvocationID}, want{exitOK, parked.InvocationID}},
		{[]string{"checkpoints", "list"}, want{exitOK, "CHECKPOINT"}, want{exitOK, "CHECKPOINT"}},
		{[]string{"checkpoints", "show", "cp-1-" + done.InvocationID}, want{exitError, "E3702"}, want{exitError, "E3702"}},
		{[]string{"tail", "--all", "--count", "2"}, want{exitOK, "demo"}, want{exitOK, "demo"}},
		{[]string{"approve", parked.InvocationID}, want{exitNotPermitted, "may not publish to tool.svc.approval"}, want{exitOK, "approved " + parked.InvocationID}},
	}
	for _, c := range cases {
		for _, role := range []struct {
			name string
			args []string
			want want
		}{{"agent", asAgent(c.args...), c.agent}, {"operator", asOperator(c.args...), c.operator},
			{"worker", asWorker(c.args...), want{exitNotPermitted, "may not publish to "}}} {
			start := time.Now()
			r := tg(t, "", role.args...)
			took := time.Since(start)
			out := r.stdout
			if role.want.code != exitOK {
				out = r.stderr
			}
			if r.code != role.want.code || !strings.Contains(out, role.want.out) || took > 5*time.Second {
				t.Errorf("%v as %s: exit %d after %s, want %d within 5s and %q in\nstdout %s\nstderr %s",
					c.args, role.name, r.code, took.Round(time.Millisecond), role.want.code, role.want.out, r.stdout, r.stderr)
			}
		}
	}
}

// bearer adds a capability token to every HTTP request.
type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

// TestMCPHTTPAsAgent: `toolgate mcp --listen` with only an agent's token
// serves that agent's tenant over streamable HTTP, from outside the
// repository, without any other credentials.
func TestMCPHTTPAsAgent(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	tok := agentToken(t, s, "mcp-http-agent", time.Hour, "echo")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	cmd := toolgateCmd(t, dir, []string{"TOOLGATE_TOKEN=" + tok}, "mcp", "--listen", addr, "--nats", s.url,
		"--jwks", node.DevJWKSPath(s.data), "--log-level", "warn")
	var stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() })
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var cs *mcp.ClientSession
	waitFor(t, "the HTTP front end", func() bool {
		cs, err = mcp.NewClient(&mcp.Implementation{Name: "http-agent", Version: "1"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", HTTPClient: &http.Client{Transport: bearer(tok)}}, nil)
		return err == nil
	})
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"message": "over http"}})
	if err != nil || res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "over http") {
		t.Fatalf("tools/call echo: %v %+v\n%s", err, res, stderr.String())
	}
	// Connected as an agent of demo, it serves no other tenant.
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	req.Header.Set("Authorization", "Bearer "+otherTenantToken(t, s))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a token of another tenant: HTTP %d, want 401", resp.StatusCode)
	}
}

// otherTenantToken is a token of the development key for tenant other.
func otherTenantToken(t *testing.T, s server) string {
	t.Helper()
	k, err := token.LoadSigningKey(filepath.Join(s.data, "dev-signing-key.jwk"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := token.Mint(k, token.Claims{
		ToolID: token.Patterns{"echo"}, TenantID: "other", AgentDID: node.DevAgent, AllowedOperations: []string{token.OperationExecute},
		RegisteredClaims: jwt.RegisteredClaims{Issuer: "toolgate", Audience: jwt.ClaimStrings{"toolgate"}, Subject: node.DevAgent,
			ID: "other-tenant", IssuedAt: jwt.NewNumericDate(time.Now()), ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))},
	})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestRefusalsExplainThemselves: each way the bus refuses an agent or an
// anonymous caller ends at once with its own exit status and a message
// saying what happened and what to do.
func TestRefusalsExplainThemselves(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	tok := agentToken(t, s, "refusals-agent", time.Hour, "echo")
	expired := agentToken(t, s, "expired-agent", -time.Minute, "echo")
	cases := []struct {
		name string
		args []string
		code int
		says []string
	}{
		{"expired token", []string{"status", "x", "--token", expired}, exitExpired, []string{"E3202", "expired at", "new one"}},
		{"not a token the bus accepts", []string{"status", "x", "--token", otherKeyToken(t)}, exitRefused, []string{"E3223", "revoked", "toolgate token inspect"}},
		{"anonymous", []string{"tools", "list"}, exitRefused, []string{"E3223", "no anonymous connections", "--creds"}},
		{"another tenant", []string{"status", "x", "--token", tok, "--tenant", "other"}, exitWrongTenant, []string{"E3014", "tenant demo", "drop --tenant"}},
		{"no inbox prefix", []string{"status", "x", "--token", tok, "--inbox-prefix", "_INBOX.elsewhere"}, exitInbox, []string{"E3222", "_INBOX.<tenant>.<token id>"}},
		{"not permitted", []string{"policy", "show", "--token", tok}, exitNotPermitted, []string{"E3221", "tool.svc.policy.get", "operator credentials"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			r := tg(t, "", append(c.args, "--nats", s.url)...)
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("took %s, want under 5s", took)
			}
			if r.code != c.code {
				t.Errorf("exit %d, want %d\n%s", r.code, c.code, r.stderr)
			}
			for _, w := range c.says {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
		})
	}
}

// TestTail: --all --count N prints the last N stored events and ends, also
// when fewer exist; --json is JSON Lines; an agent follows its tenant's
// new events and reads the stored ones through its tenant's history
// endpoint, and is told at once that other tenants' are not its to read.
func TestTail(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	for i := range 3 {
		if r := tg(t, "", s.flags("invoke", "echo", "--params", fmt.Sprintf(`{"message":"m%d"}`, i), "--wait")...); r.code != exitOK {
			t.Fatalf("invoke: %d %s", r.code, r.stderr)
		}
	}
	lines := func(s string) []string { return strings.Split(strings.TrimSpace(s), "\n") }
	start := time.Now()
	every := tg(t, "", s.flags("tail", "--all", "--count", "1000", "--json")...)
	if every.code != exitOK || time.Since(start) > 5*time.Second {
		t.Fatalf("tail --all --count 1000 with fewer stored: exit %d after %s\n%s", every.code, time.Since(start), every.stderr)
	}
	all := lines(every.stdout)
	if len(all) < 6 { // tool.invoked and tool.succeeded for each call
		t.Fatalf("tail --all --count 1000: %d lines\n%s", len(all), every.stdout)
	}
	for _, l := range all {
		var ev struct {
			Subject string `json:"subject"`
			Event   struct {
				Type string `json:"type"`
			} `json:"event"`
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil || !strings.HasPrefix(ev.Subject, "audit.demo.") || !strings.HasPrefix(ev.Event.Type, "ai.agent.") {
			t.Fatalf("not a JSON Lines audit event (%v): %s", err, l)
		}
	}
	last := tg(t, "", s.flags("tail", "--all", "--count", "2", "--json")...)
	if got := lines(last.stdout); last.code != exitOK || len(got) != 2 || got[0] != all[len(all)-2] || got[1] != all[len(all)-1] {
		t.Fatalf("tail --all --count 2: exit %d\n%s\nwant the last two of\n%s", last.code, last.stdout, every.stdout)
	}

	tok := agentToken(t, s, "tail-agent", time.Hour, "echo")
	// An agent reads the stored trail through its tenant's history
	// endpoint: the same last events.
	agentLast := tg(t, "", "tail", "--all", "--count", "2", "--json", "--nats", s.url, "--token", tok)
	if got := lines(agentLast.stdout); agentLast.code != exitOK || len(got) != 2 || got[0] != all[len(all)-2] || got[1] != all[len(all)-1] {
		t.Fatalf("tail --all --count 2 as an agent: exit %d\n%s%s\nwant the last two of\n%s", agentLast.code, agentLast.stdout, agentLast.stderr, every.stdout)
	}
	if r := tg(t, "", "tail", "--all-tenants", "--nats", s.url, "--token", tok); r.code != exitNotPermitted || !strings.Contains(r.stderr, "operator credentials") {
		t.Fatalf("tail --all-tenants as an agent: exit %d\n%s", r.code, r.stderr)
	}
	// An agent's tail --all --follow prints the stored trail, then follows it.
	ctx, cancel := context.WithCancel(t.Context())
	var follow syncBuffer
	followed := make(chan int, 1)
	go func() {
		followed <- run(ctx, []string{"tail", "--all", "--follow", "--json", "--nats", s.url, "--token", tok}, strings.NewReader(""), &follow, io.Discard)
	}()
	r := tg(t, "", "invoke", "echo", "--params", `{"message":"followed"}`, "--wait", "--json", "--nats", s.url, "--token", tok)
	var followedCall api.Response
	if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &followedCall) != nil {
		t.Fatalf("invoke as agent: %d %s", r.code, r.stderr)
	}
	waitFor(t, "the followed call in the agent's tail --all", func() bool {
		return strings.Contains(follow.String(), `"invocation_id":"`+followedCall.InvocationID+`"`)
	})
	cancel()
	if code := <-followed; code != exitOK || lines(follow.String())[0] != all[0] {
		t.Fatalf("tail --all as an agent: exit %d, first line %q, want %q", code, lines(follow.String())[0], all[0])
	}
	var out syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(t.Context(), []string{"tail", "--count", "1", "--json", "--nats", s.url, "--token", tok}, strings.NewReader(""), &out, io.Discard)
	}()
	// The live tail subscribes once it runs: invoke until it has seen one.
	deadline := time.After(20 * time.Second)
	for {
		if r := tg(t, "", "invoke", "echo", "--params", `{"message":"live"}`, "--wait", "--nats", s.url, "--token", tok); r.code != exitOK {
			t.Fatalf("invoke as agent: %d %s", r.code, r.stderr)
		}
		select {
		case code := <-done:
			if code != exitOK || !strings.Contains(out.String(), `"subject":"audit.demo.`) {
				t.Fatalf("live tail as an agent: exit %d\n%s", code, out.String())
			}
			return
		case <-deadline:
			t.Fatal("the agent's live tail saw nothing")
		default:
		}
	}
}

// TestSeedFilesEndWithTheSeed: the .nk halves serve and creds issue write
// hold the seed and nothing after it (nkeys.js refuses a trailing newline).
func TestSeedFilesEndWithTheSeed(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	issued := filepath.Join(t.TempDir(), "bob.creds")
	if r := tg(t, "", "--data", s.data, "creds", "issue", "--name", "bob", "--out", issued); r.code != exitOK {
		t.Fatalf("creds issue: %d %s", r.code, r.stderr)
	}
	for _, p := range []string{filepath.Join(s.data, "busauth", "operator.nk"), strings.TrimSuffix(issued, ".creds") + ".nk"} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nkeys.FromSeed(b); err != nil || strings.TrimSpace(string(b)) != string(b) {
			t.Errorf("%s: %q is not exactly a seed (%v)", p, b, err)
		}
	}
}

// TestBudgetsShow: a token bound to a session invokes without --session;
// without --session the budget shown is the token tree's, where calls are
// charged; a plain session id is refused, not shown as nothing spent.
func TestBudgetsShow(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	k, err := token.LoadSigningKey(filepath.Join(s.data, "dev-signing-key.jwk"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := token.Mint(k, token.Claims{
		ToolID: token.Patterns{"echo"}, TenantID: "demo", AgentDID: node.DevAgent, AllowedOperations: []string{token.OperationExecute},
		SessionID: "s1", Budget: &token.Budget{MaxCalls: 100},
		RegisteredClaims: jwt.RegisteredClaims{Issuer: "toolgate", Audience: jwt.ClaimStrings{"toolgate"}, Subject: node.DevAgent,
			ID: "budgeted", IssuedAt: jwt.NewNumericDate(time.Now()), ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The token is bound to session s1: invoke names it without being told.
	if r := tg(t, "", "invoke", "echo", "--params", `{"message":"charged"}`, "--wait", "--nats", s.url, "--token", tok); r.code != exitOK {
		t.Fatalf("invoke: %d %s", r.code, r.stderr)
	}
	var st api.BudgetStatus
	// Usage is charged as the call ends, beside its result.
	waitFor(t, "the call charged to the token's budget", func() bool {
		r := tg(t, "", "budgets", "show", "--max-calls", "100", "--nats", s.url, "--token", tok)
		return r.code == exitOK && json.Unmarshal([]byte(r.stdout), &st) == nil && st.Used.Calls >= 1
	})
	if st.Session != "token:budgeted" {
		t.Errorf("budget of %s, want token:budgeted", st.Session)
	}
	if r := tg(t, "", "budgets", "show", "--session", "s1", "--nats", s.url, "--token", tok); r.code != exitUsage || !strings.Contains(r.stderr, "token:<jti>") {
		t.Fatalf("budgets show --session s1: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestMCPExpiredToken: `toolgate mcp --stdio` with an expired token says
// so and exits with the expired status, instead of a bare refusal.
func TestMCPExpiredToken(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	t.Setenv("TOOLGATE_TOKEN", agentToken(t, s, "mcp-expired", -time.Minute, "echo"))
	r := tg(t, "", "mcp", "--stdio", "--nats", s.url)
	if r.code != exitExpired || !strings.Contains(r.stderr, "expired at") {
		t.Fatalf("exit %d, want %d and why\n%s", r.code, exitExpired, r.stderr)
	}
}

// TestAuditHistoryAsAgent: an agent with only its token pages through its
// tenant's stored audit events with the cursor each page gives, sees every
// one of them once and no other tenant's; an agent of another tenant is
// refused, by the command and by the bus.
func TestAuditHistoryAsAgent(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	tok := agentToken(t, s, "history-agent", time.Hour, "echo")
	other := otherTenantToken(t, s)
	asAgent := func(args ...string) []string { return append(args, "--nats", s.url, "--token", tok) }
	var ids []string
	for i := range 3 {
		r := tg(t, "", asAgent("invoke", "echo", "--params", fmt.Sprintf(`{"message":"m%d"}`, i), "--wait", "--json")...)
		var done api.Response
		if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &done) != nil {
			t.Fatalf("invoke: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		ids = append(ids, done.InvocationID)
	}
	// Another tenant's events, which demo's history must not show.
	if r := tg(t, "", "invoke", "echo", "--params", `{"message":"x"}`, "--wait", "--nats", s.url, "--token", other); r.code != exitOK {
		t.Fatalf("invoke as other: exit %d %s", r.code, r.stderr)
	}
	page := func(cursor string) api.AuditHistoryResponse {
		t.Helper()
		r := tg(t, "", asAgent("audit", "history", "--json", "--page-size", "2", "--cursor", cursor)...)
		var p api.AuditHistoryResponse
		if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &p) != nil {
			t.Fatalf("audit history --cursor %q: exit %d\n%s%s", cursor, r.code, r.stdout, r.stderr)
		}
		return p
	}
	var seen []api.AuditEntry
	var terminal map[string]bool
	waitFor(t, "every call's terminal event in the history", func() bool {
		seen, terminal = nil, map[string]bool{}
		p := page("")
		for pages := 0; ; pages++ {
			if len(p.Events) > 2 {
				t.Fatalf("a page of size 2 holds %d events", len(p.Events))
			}
			seen = append(seen, p.Events...)
			if !p.More || pages > 100 {
				break
			}
			p = page(p.NextCursor)
		}
		for _, e := range seen {
			if strings.HasSuffix(e.Subject, ".tool.succeeded") {
				var ev struct {
					Data struct {
						InvocationID string `json:"invocation_id"`
					} `json:"data"`
				}
				_ = json.Unmarshal(e.Event, &ev)
				terminal[ev.Data.InvocationID] = true
			}
		}
		return len(terminal) == len(ids)
	})
	events := map[string]bool{}
	for _, e := range seen {
		if !strings.HasPrefix(e.Subject, "audit.demo.") {
			t.Errorf("demo's history holds %s", e.Subject)
		}
		var ev struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(e.Event, &ev) != nil || ev.ID == "" || events[ev.ID] {
			t.Errorf("event %s read twice or without an id: %s", e.Subject, e.Event)
		}
		events[ev.ID] = true
	}
	for _, id := range ids {
		if !terminal[id] {
			t.Errorf("no tool.succeeded of %s in the history", id)
		}
	}
	// The last page's cursor, asked again, answers only what came since.
	p := page("")
	for p.More {
		p = page(p.NextCursor)
	}
	if again := page(p.NextCursor); len(again.Events) != 0 || again.NextCursor != p.NextCursor {
		t.Errorf("the end cursor answered %d events and cursor %s, want none and %s", len(again.Events), again.NextCursor, p.NextCursor)
	}
	r := tg(t, "", asAgent("invoke", "echo", "--params", `{"message":"later"}`, "--wait", "--json")...)
	var later api.Response
	_ = json.Unmarshal([]byte(r.stdout), &later)
	waitFor(t, "the later call in the history", func() bool {
		r := tg(t, "", asAgent("audit", "history", "--json", "--cursor", p.NextCursor)...)
		return strings.Contains(r.stdout, later.InvocationID)
	})
	// --since starts at the first event stored at or after it.
	var since time.Time
	for p := page(""); ; p = page(p.NextCursor) {
		for _, e := range p.Events {
			if since.IsZero() && strings.Contains(string(e.Event), later.InvocationID) {
				since = e.Time
			}
		}
		if !p.More {
			break
		}
	}
	r = tg(t, "", asAgent("audit", "history", "--all", "--json", "--since", since.Format(time.RFC3339Nano))...)
	if r.code != exitOK || !strings.Contains(r.stdout, later.InvocationID) || strings.Contains(r.stdout, ids[0]) {
		t.Errorf("--since %s: exit %d, want %s's events and none of %s's\n%s%s", since.Format(time.RFC3339Nano), r.code, later.InvocationID, ids[0], r.stdout, r.stderr)
	}
	r = tg(t, "", asAgent("audit", "history", "--json", "--since", time.Now().Add(time.Hour).Format(time.RFC3339))...)
	var none api.AuditHistoryResponse
	if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &none) != nil || len(none.Events) != 0 || none.More {
		t.Errorf("--since an hour ahead: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// An agent of tenant other: its own history holds none of demo's, and
	// demo's is refused at once, by the command and, asked directly, by the bus.
	r = tg(t, "", "audit", "history", "--json", "--nats", s.url, "--token", other)
	if r.code != exitOK || strings.Contains(r.stdout, "audit.demo.") || !strings.Contains(r.stdout, "audit.other.") {
		t.Errorf("other's history: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	start := time.Now()
	r = tg(t, "", "audit", "history", "--tenant", "demo", "--nats", s.url, "--token", other)
	if r.code != exitNotPermitted || !strings.Contains(r.stderr, "tool.svc.demo.audit.history") || !strings.Contains(r.stderr, "own tenant") || time.Since(start) > 5*time.Second {
		t.Errorf("other asking for demo's history: exit %d after %s\n%s", r.code, time.Since(start), r.stderr)
	}
	o := connect.Options{URL: s.url, Token: other}
	nc, err := o.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err = c.AuditHistory(ctx, "demo", api.AuditHistoryRequest{})
	if ae := api.AsError(err); err == nil || ae.ECode != api.EBusNotPermitted {
		t.Errorf("other's client asking demo's endpoint: %v, want E3221 from the bus", err)
	}
}

// TestCredsContext: `creds context` writes nats CLI contexts for the
// operator's toolgate-issued credentials and for an agent's token; toolgate
// connects with each, signs a decision with the operator's (E3217 unsigned
// before), and the nats CLI, when installed, connects with both.
func TestCredsContext(t *testing.T) {
	cleanEnv(t)
	for _, k := range []string{"NATS_NKEY", "NATS_TOKEN"} {
		t.Setenv(k, "")
	}
	cfg := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfg)
	s := startToolgate(t)
	registerApprovalTool(t, s, "ctx.human")
	tok := agentToken(t, s, "ctx-agent", time.Hour, "echo", "ctx.human")
	opCreds := filepath.Join(s.data, "busauth", "operator.creds")
	if r := tg(t, "", "creds", "context", "tg-op", "--creds", opCreds, "--nats", s.url); r.code != exitOK || !strings.Contains(r.stdout, "nats --context tg-op") {
		t.Fatalf("creds context tg-op: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := tg(t, "", "creds", "context", "tg-agent", "--token", tok, "--nats", s.url); r.code != exitOK || !strings.Contains(r.stdout, "_INBOX.demo.ctx-agent") {
		t.Fatalf("creds context tg-agent: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := tg(t, "", "creds", "context", "tg-agent", "--token", tok); r.code == exitOK || !strings.Contains(r.stderr, "exists") {
		t.Errorf("a second creds context tg-agent: exit %d %s, want refused without --force", r.code, r.stderr)
	}
	info, err := os.Stat(filepath.Join(cfg, "nats", "context", "tg-op.json"))
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("the context file: %v %v, want mode 0600", err, info)
	}

	// As the agent, through its context only.
	r := tg(t, "", "tools", "list", "--context", "tg-agent")
	if r.code != exitOK || !strings.Contains(r.stdout, "ctx.human") {
		t.Fatalf("tools list --context tg-agent: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = tg(t, "", "invoke", "ctx.human", "--params", `{}`, "--async", "--json", "--context", "tg-agent")
	var parked api.Response
	if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &parked) != nil {
		t.Fatalf("invoke --context tg-agent: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := tg(t, "", "breakers", "--context", "tg-agent"); r.code != exitNotPermitted {
		t.Errorf("breakers as the agent's context: exit %d, want %d\n%s", r.code, exitNotPermitted, r.stderr)
	}
	waitFor(t, "the approval request", func() bool {
		return strings.Contains(tg(t, "", "approvals", "list", "--context", "tg-agent").stdout, parked.InvocationID)
	})
	// As the operator, through its context: the decision is signed.
	r = tg(t, "", "approve", parked.InvocationID, "--tenant", "demo", "--context", "tg-op", "--json")
	var a api.Approval
	if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &a) != nil || a.DecidedBy != "operator:local" {
		t.Fatalf("approve --context tg-op: exit %d, decided by %q\n%s%s", r.code, a.DecidedBy, r.stdout, r.stderr)
	}

	natsCLI, err := exec.LookPath("nats")
	if err != nil {
		natsCLI = filepath.Join("..", "..", ".cache", "bin", "nats")
		if !fileExists(natsCLI) {
			t.Log("the nats CLI is not installed (make nats): its part is left out")
			return
		}
	}
	nats := func(args ...string) (string, error) {
		cmd := exec.Command(natsCLI, args...)
		cmd.Env = []string{"XDG_CONFIG_HOME=" + cfg, "HOME=" + t.TempDir(), "PATH=" + os.Getenv("PATH")}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := nats("--context", "tg-agent", "req", "tool.svc.demo.status", fmt.Sprintf(`{"invocation_id":%q}`, parked.InvocationID)); err != nil || !strings.Contains(out, parked.InvocationID) {
		t.Errorf("nats --context tg-agent req: %v\n%s", err, out)
	}
	if out, err := nats("--context", "tg-op", "stream", "ls", "--names"); err != nil || !strings.Contains(out, "AUDIT") {
		t.Errorf("nats --context tg-op stream ls: %v\n%s", err, out)
	}
}

func TestMCPRevokedToken(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	revoke := func(jti string) time.Time {
		t.Helper()
		r := tg(t, "", s.flags("token", "revoke", "--jti", jti, "--reason", "leaked")...)
		if r.code != exitOK {
			t.Fatalf("token revoke: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		return time.Now()
	}

	t.Run("stdio", func(t *testing.T) {
		tok := agentToken(t, s, "mcp-revoked-stdio", time.Hour, "echo")
		cmd := toolgateCmd(t, t.TempDir(), []string{"TOOLGATE_TOKEN=" + tok}, "mcp", "--stdio", "--nats", s.url, "--log-level", "warn")
		var stderr syncBuffer
		cmd.Stderr = &stderr
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "desktop", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatalf("connecting: %v\n%s", err, stderr.String())
		}
		if _, err := cs.ListTools(ctx, nil); err != nil {
			t.Fatalf("tools/list: %v\n%s", err, stderr.String())
		}
		at := revoke("mcp-revoked-stdio")
		ended := make(chan error, 1)
		go func() { ended <- cs.Wait() }()
		select {
		case <-ended:
		case <-time.After(15 * time.Second):
			t.Fatalf("the session of a revoked token still runs 15 s after the revocation\n%s", stderr.String())
		}
		took := time.Since(at)
		_ = cs.Close()
		if cmd.ProcessState == nil {
			_ = cmd.Wait()
		}
		if code := cmd.ProcessState.ExitCode(); code != exitRevoked || !strings.Contains(stderr.String(), "E3208") {
			t.Fatalf("exit %d after %v, want %d and E3208\n%s", code, took, exitRevoked, stderr.String())
		}
		t.Logf("the stdio session ended %v after the revocation", took.Round(time.Millisecond))
	})

	t.Run("http", func(t *testing.T) {
		tok := agentToken(t, s, "mcp-revoked-http", time.Hour, "echo")
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		cmd := toolgateCmd(t, t.TempDir(), []string{"TOOLGATE_TOKEN=" + tok}, "mcp", "--listen", addr, "--nats", s.url,
			"--jwks", node.DevJWKSPath(s.data), "--log-level", "warn")
		var stderr syncBuffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() })
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		var cs *mcp.ClientSession
		waitFor(t, "the HTTP front end", func() bool {
			cs, err = mcp.NewClient(&mcp.Implementation{Name: "http-agent", Version: "1"}, nil).Connect(ctx,
				&mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", HTTPClient: &http.Client{Transport: bearer(tok)}}, nil)
			return err == nil
		})
		defer cs.Close()
		if _, err := cs.ListTools(ctx, nil); err != nil {
			t.Fatalf("tools/list: %v\n%s", err, stderr.String())
		}
		post := func() int {
			req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"tools/list"}`))
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Mcp-Session-Id", cs.ID())
			req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		if code := post(); code != http.StatusOK {
			t.Fatalf("before the revocation: HTTP %d\n%s", code, stderr.String())
		}
		at := revoke("mcp-revoked-http")
		deadline := time.Now().Add(15 * time.Second)
		for post() != http.StatusUnauthorized {
			if time.Now().After(deadline) {
				t.Fatalf("the session of a revoked token is still served 15 s after the revocation\n%s", stderr.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("the HTTP session answered 401 %v after the revocation", time.Since(at).Round(time.Millisecond))
		if _, err := cs.ListTools(ctx, nil); err == nil {
			t.Fatal("the session still lists tools after the revocation")
		}
	})
}

func TestMCPServiceFrontHonoursSignedManifests(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	nc, err := nats.Connect(s.url, busauth.CredentialsOption(node.CredsPath(s.data, busauth.RoleControl)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cs, err := kvstore.Open(ctx, js, kvstore.Options{Bind: true, Buckets: busauth.Rights[busauth.RoleControl].Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RegisterTool(ctx, []byte(`{"id":"forged.tool","name":"forged","version":"1.0.0","description":"nobody signed this",
		"kind":"builtin","builtin":{"function":"echo"},"input_schema":{"type":"object"},"safety":{"risk_level":"low"}}`), false); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := toolgateCmd(t, t.TempDir(), nil, "mcp", "--listen", addr, "--nats", s.url,
		"--creds", node.CredsPath(s.data, busauth.RoleOperator), "--jwks", node.DevJWKSPath(s.data), "--log-level", "warn")
	var stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() })
	tok := agentToken(t, s, "mcp-service-front", time.Hour, "*")
	var sess *mcp.ClientSession
	waitFor(t, "the HTTP front end", func() bool {
		sess, err = mcp.NewClient(&mcp.Implementation{Name: "http-agent", Version: "1"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", HTTPClient: &http.Client{Transport: bearer(tok)}}, nil)
		return err == nil
	})
	defer sess.Close()
	lr, err := sess.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v\n%s", err, stderr.String())
	}
	var names []string
	for _, tl := range lr.Tools {
		names = append(names, tl.Name)
	}
	if !slices.Contains(names, "echo") || slices.Contains(names, "forged.tool") {
		t.Fatalf("tools/list shows %v: want echo (signed at start) and not forged.tool\n%s", names, stderr.String())
	}
}
