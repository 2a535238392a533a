package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
)

// hostile is a parameter an agent controls: every part of it must reach
// the console's pages as text.
const hostile = `<script>window.__pwned=1</script><img src=x onerror="window.__pwned=1"><a href="javascript:window.__pwned=1">click</a>`

// consoleRun is a running `toolgate console`: its base URL and the login
// links it printed.
type consoleRun struct {
	base string
	out  *syncBuffer
}

// links returns every login link printed so far.
func (c consoleRun) links() []string {
	return regexp.MustCompile(`https?://\S+/login\?token=\S+`).FindAllString(c.out.String(), -1)
}

// startConsole runs `toolgate console` against s on a free loopback port.
func startConsole(t *testing.T, s server) consoleRun {
	t.Helper()
	var out, errb syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		// The operator's credentials, which the overview's budgets and
		// breakers need: allowed explicitly.
		done <- run(ctx, s.flags("console", "--allow-admin", "--listen", "127.0.0.1:0", "--tenants", "demo"), strings.NewReader(""), &out, &errb)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != exitOK {
				t.Errorf("console exit %d: %s", code, errb.String())
			}
		case <-time.After(10 * time.Second):
			t.Error("console did not stop")
		}
	})
	c := consoleRun{out: &out}
	waitFor(t, "the console's login link", func() bool { return len(c.links()) > 0 })
	u, _ := url.Parse(c.links()[0])
	c.base = u.Scheme + "://" + u.Host
	return c
}

// registerConsoleTool registers needs.human, a tool every call of which
// waits for a person.
func registerConsoleTool(t *testing.T, s server) {
	t.Helper()
	man := initManifest("needs.human")
	man["safety"].(map[string]any)["requires_approval"] = true
	man["safety"].(map[string]any)["risk_level"] = "high"
	man["input_schema"] = map[string]any{"type": "object"}
	doc, _ := json.Marshal(man)
	if r := tg(t, string(doc), s.flags("tools", "register", "-")...); r.code != exitOK {
		t.Fatalf("register: %d %s", r.code, r.stderr)
	}
}

// parkCall invokes needs.human with the hostile parameter and returns the
// channel its exit status arrives on.
func parkCall(t *testing.T, s server, id string) <-chan int {
	t.Helper()
	params, _ := json.Marshal(map[string]string{"message": hostile, "password": "hunter2"})
	done := make(chan int, 1)
	go func() {
		var out, errb syncBuffer
		done <- run(t.Context(), s.flags("invoke", "needs.human", "--id", id, "--wait", "--params", string(params)), strings.NewReader(""), &out, &errb)
	}()
	return done
}

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

func get(t *testing.T, c *http.Client, u string) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func post(t *testing.T, c *http.Client, u, origin string, form url.Values) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var (
	csrfRe   = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	digestRe = regexp.MustCompile(`name="digest" value="([^"]+)"`)
)

// TestConsole: no page without a session; the login link works once and
// sets an HttpOnly, SameSite=Strict cookie; a parked call appears in the
// inbox with its parameters redacted and its HTML escaped; a decision
// without the CSRF token or from another origin is refused; approving
// signed as the operator lets the call finish; a second decision gets
// E3215; the invocation's timeline, the live audit stream and the overview
// show the call.
func TestConsole(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	registerConsoleTool(t, s)
	con := startConsole(t, s)
	anon := &http.Client{CheckRedirect: noRedirect, Timeout: 20 * time.Second}

	for _, p := range []string{"/", "/approvals", "/audit", "/audit/stream", "/overview", "/invocations/demo/x", "/audit/event/1"} {
		if code, body, _ := get(t, anon, con.base+p); code != http.StatusUnauthorized || strings.Contains(body, "<html") {
			t.Fatalf("GET %s without a session: %d\n%s", p, code, body)
		}
	}
	if code, _ := post(t, anon, con.base+"/approvals/demo/x", con.base, url.Values{"decision": {"approve"}}); code != http.StatusUnauthorized {
		t.Fatalf("POST without a session: %d", code)
	}
	if code, _, _ := get(t, anon, con.base+"/login?token=guess"); code != http.StatusForbidden {
		t.Fatalf("a guessed login token: %d", code)
	}

	link := con.links()[0]
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, CheckRedirect: noRedirect, Timeout: 20 * time.Second}
	code, _, h := get(t, browser, link)
	cookie := h.Get("Set-Cookie")
	if code != http.StatusSeeOther || !strings.Contains(cookie, "HttpOnly") || !strings.Contains(cookie, "SameSite=Strict") {
		t.Fatalf("login: %d, Set-Cookie %q", code, cookie)
	}
	if code, _, _ := get(t, anon, link); code != http.StatusForbidden {
		t.Fatalf("the login link used a second time: %d", code)
	}
	waitFor(t, "the next login link", func() bool { return len(con.links()) == 2 && con.links()[1] != link })

	id := "console-http-1"
	finished := parkCall(t, s, id)
	var body string
	waitFor(t, "the parked call in the inbox", func() bool {
		_, body, h = get(t, browser, con.base+"/")
		return strings.Contains(body, `id="approval-`+id+`"`)
	})
	if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
		t.Fatalf("Content-Security-Policy %q", csp)
	}
	if strings.Contains(body, "<script>window") || strings.Contains(body, "<img src=x") || strings.Contains(body, `href="javascript:`) ||
		!strings.Contains(body, "&lt;script&gt;") || strings.Contains(body, "hunter2") || !strings.Contains(body, "high risk") {
		t.Fatalf("the inbox does not show the parameters escaped and redacted:\n%s", body)
	}
	m, d := csrfRe.FindStringSubmatch(body), digestRe.FindStringSubmatch(body)
	if m == nil || d == nil {
		t.Fatalf("no CSRF token or digest in the form:\n%s", body)
	}
	csrf, digest := m[1], d[1]
	decide := con.base + "/approvals/demo/" + id
	for _, tc := range []struct {
		name, origin string
		form         url.Values
	}{
		{"no CSRF token", con.base, url.Values{"decision": {"approve"}, "digest": {digest}}},
		{"a wrong CSRF token", con.base, url.Values{"decision": {"approve"}, "digest": {digest}, "csrf": {"x" + csrf}}},
		{"another origin", "http://evil.example", url.Values{"decision": {"approve"}, "digest": {digest}, "csrf": {csrf}}},
		{"no origin", "", url.Values{"decision": {"approve"}, "digest": {digest}, "csrf": {csrf}}},
	} {
		if code, body := post(t, browser, decide, tc.origin, tc.form); code != http.StatusForbidden {
			t.Fatalf("a decision with %s: %d\n%s", tc.name, code, body)
		}
	}
	r := tg(t, "", s.flags("approvals", "show", id, "--json")...)
	var a api.ApprovalSummary
	if err := json.Unmarshal([]byte(r.stdout), &a); err != nil || a.State != "pending" {
		t.Fatalf("after refused decisions the approval is %q (%v)", a.State, err)
	}

	code, body = post(t, browser, decide, con.base, url.Values{"decision": {"approve"}, "digest": {digest}, "csrf": {csrf}, "reason": {"looks right"}})
	if code != http.StatusOK || !strings.Contains(body, "approved "+id) {
		t.Fatalf("approve: %d\n%s", code, body)
	}
	select {
	case code := <-finished:
		if code != exitOK {
			t.Fatalf("the approved call ended with exit %d", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the approved call did not finish")
	}
	r = tg(t, "", s.flags("approvals", "show", id, "--json")...)
	if err := json.Unmarshal([]byte(r.stdout), &a); err != nil || a.State != "approved" || !strings.HasPrefix(a.DecidedBy, "operator:") || a.Reason != "looks right" {
		t.Fatalf("the decision recorded: %+v (%v)", a, err)
	}
	code, body = post(t, browser, decide, con.base, url.Values{"decision": {"deny"}, "csrf": {csrf}})
	if code != http.StatusConflict || !strings.Contains(body, api.EApprovalDecided) || !strings.Contains(body, "already approved by operator:") {
		t.Fatalf("a second decision: %d\n%s", code, body)
	}

	waitFor(t, "the finished call's timeline", func() bool {
		_, body, _ = get(t, browser, con.base+"/invocations/demo/"+id)
		return strings.Contains(body, ">success<") && strings.Contains(body, "tool.approval.granted") && strings.Contains(body, "tool.succeeded")
	})
	if !strings.Contains(body, "tool.approval.requested") || !strings.Contains(body, `id="hops"`) || strings.Contains(body, "<script>window") {
		t.Fatalf("the invocation page:\n%s", body)
	}

	// The live stream, filtered by text: the call's events, as JSON.
	resp, err := browser.Get(con.base + "/audit/stream?tool=needs.human&q=" + id)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("stream Content-Type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var ev struct {
		Type, Tool, Tenant string
		InvocationID       string `json:"invocation_id"`
	}
	for sc.Scan() {
		if line, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: ")); ok {
			if err := json.Unmarshal(line, &ev); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if ev.InvocationID != id || !strings.HasPrefix(ev.Tool, "needs.human") || ev.Tenant != "demo" {
		t.Fatalf("first streamed event: %+v", ev)
	}
	_, body, _ = get(t, browser, con.base+"/audit?status=success")
	if !strings.Contains(body, id) {
		t.Fatalf("the audit page filtered by status success does not list %s:\n%s", id, body)
	}
	// Open an event: the whole event, redacted again, escaped.
	seq := regexp.MustCompile(`href="/audit/event/(\d+)"`).FindStringSubmatch(body)
	if seq == nil {
		t.Fatalf("the audit page links no event:\n%s", body)
	}
	code, body, _ = get(t, browser, con.base+"/audit/event/"+seq[1])
	if code != http.StatusOK || !strings.Contains(body, id) || strings.Contains(body, "hunter2") || strings.Contains(body, "<script>window") {
		t.Fatalf("an audit event's page: %d\n%s", code, body)
	}
	_, body, _ = get(t, browser, con.base+"/overview")
	if !strings.Contains(body, "needs.human<") || !strings.Contains(body, "success") {
		t.Fatalf("the overview:\n%s", body)
	}
}

// TestConsoleListen: a non-loopback address needs TLS.
func TestConsoleListen(t *testing.T) {
	cleanEnv(t)
	for _, args := range [][]string{
		{"console", "--listen", "0.0.0.0:0"},
		{"console", "--listen", "192.0.2.1:8080"},
		{"console", "--tls-cert", "c.pem"},
	} {
		r := tg(t, "", append(args, "--nats", "nats://127.0.0.1:1")...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "tls-") {
			t.Fatalf("%v: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
}

// TestServeConsole: serve --console serves the console as approver:local
// once the pipeline is up; a non-loopback --console needs TLS.
func TestServeConsole(t *testing.T) {
	cleanEnv(t)
	if r := tg(t, "", "serve", "--console", "0.0.0.0:8080", "--data", t.TempDir()); r.code != exitUsage || !strings.Contains(r.stderr, "--console-tls-cert") {
		t.Fatalf("serve --console 0.0.0.0:8080: exit %d, stderr %q", r.code, r.stderr)
	}
	var out, errb syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--data", t.TempDir(), "--listen", "127.0.0.1:-1", "--sandbox", "none", "--log-level", "error",
			"--console", "127.0.0.1:0"}, strings.NewReader(""), &out, &errb)
	}()
	defer func() {
		cancel()
		<-done
	}()
	con := consoleRun{out: &out}
	waitFor(t, "serve's console login link", func() bool { return len(con.links()) > 0 })
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: 20 * time.Second}
	code, body, _ := get(t, c, con.links()[0])
	if code != http.StatusOK || !strings.Contains(body, "<h1>Approvals</h1>") {
		t.Fatalf("serve's console after sign-in: %d\n%s", code, body)
	}
}

// TestConsoleBudgets: the overview lists a session that has used its cap
// of calls, with how much, and leaves out one far from its cap.
func TestConsoleBudgets(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	con := startConsole(t, s)
	for _, b := range []struct {
		jti      string
		maxCalls int64
	}{{"near-cap", 2}, {"far-cap", 100}} {
		spendBudget(t, s, b.jti, b.maxCalls, 2)
	}
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, CheckRedirect: noRedirect, Timeout: 20 * time.Second}
	if code, _, _ := get(t, browser, con.links()[0]); code != http.StatusSeeOther {
		t.Fatalf("login: %d", code)
	}
	code, body, _ := get(t, browser, con.base+"/overview")
	if code != http.StatusOK || !strings.Contains(body, `id="budgets"`) {
		t.Fatalf("the overview lists no budget: %d\n%s", code, body)
	}
	if !strings.Contains(body, "<td>token:near-cap</td><td>calls</td><td>2 of 2 (100%)</td>") || !strings.Contains(body, ">exhausted<") {
		t.Fatalf("the overview does not show near-cap's calls spent:\n%s", body)
	}
	if strings.Contains(body, "far-cap") {
		t.Fatalf("the overview lists a budget at 2%% of its cap:\n%s", body)
	}
}

// spendBudget makes calls calls of echo with a token of its own whose
// budget allows maxCalls calls: its session is token:<jti>.
func spendBudget(t *testing.T, s server, jti string, maxCalls int64, calls int) {
	t.Helper()
	k, err := token.LoadSigningKey(filepath.Join(s.data, "dev-signing-key.jwk"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := token.Mint(k, token.Claims{
		ToolID: token.Patterns{"echo"}, TenantID: "demo", AgentDID: node.DevAgent, AllowedOperations: []string{token.OperationExecute},
		Budget: &token.Budget{MaxCalls: maxCalls},
		RegisteredClaims: jwt.RegisteredClaims{Issuer: "toolgate", Audience: jwt.ClaimStrings{"toolgate"}, Subject: node.DevAgent,
			ID: jti, IssuedAt: jwt.NewNumericDate(time.Now()), ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))},
	})
	if err != nil {
		t.Fatal(err)
	}
	for range calls {
		if r := tg(t, "", "invoke", "echo", "--params", `{"message":"charged"}`, "--wait", "--nats", s.url, "--token", tok); r.code != exitOK {
			t.Fatalf("invoke with %s: %d %s", jti, r.code, r.stderr)
		}
	}
}
