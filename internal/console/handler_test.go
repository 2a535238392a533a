package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/connect"
	"github.com/toolgate/toolgate/internal/console"
	"github.com/toolgate/toolgate/internal/node"
)

// pipeline is a running toolgate on its embedded, authenticated bus: an
// operator's client signing as the operator, and an agent's with the
// development token of tenant demo.
type pipeline struct {
	url   string
	dir   string // the data directory, with busauth/
	op    *client.Client
	agent *client.Agent
	token string
}

func startPipeline(t *testing.T) pipeline {
	t.Helper()
	dir := t.TempDir()
	cfg := node.Config{Embedded: node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: dir}, Examples: true, Workers: 1,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cfg.Stage.Sandbox.Mode = "none"
	ready := make(chan string, 1)
	cfg.Ready = func(u string, _ *node.Node) { ready <- u }
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- node.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("node.Run: %v", err)
		}
	})
	p := pipeline{dir: dir}
	select {
	case p.url = <-ready:
	case err := <-errc:
		errc <- err
		t.Fatalf("toolgate did not start: %v", err)
	case <-time.After(90 * time.Second):
		t.Fatal("toolgate did not start in time")
	}
	creds := node.CredsPath(dir, busauth.RoleOperator)
	nc, err := nats.Connect(p.url, busauth.CredentialsOption(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if p.op, err = client.New(nc); err != nil {
		t.Fatal(err)
	}
	sg, err := busauth.SignerFromCreds(creds)
	if err != nil {
		t.Fatal(err)
	}
	p.op.Sign = func(subject string, body []byte) (nats.Header, error) { return sg.Sign(nil, subject, body, time.Now()) }
	tok, err := os.ReadFile(node.DevTokenPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	p.token = strings.TrimSpace(string(tok))
	ao := connect.Options{URL: p.url, Token: p.token}
	anc, err := ao.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(anc.Close)
	if p.agent, err = client.NewAgent(anc); err != nil {
		t.Fatal(err)
	}
	p.agent.Source = "urn:toolgate:test"
	return p
}

// invoke sends a call of tool by the demo agent with id, and returns at
// once.
func (p pipeline) invoke(t *testing.T, tool, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := p.agent.Invoke(ctx, api.Request{ToolID: tool, Parameters: json.RawMessage(`{"message":"hello"}`), CapabilityToken: p.token,
		AgentContext: api.AgentContext{TenantID: node.DevTenant, AgentDID: node.DevAgent}}, client.InvokeOptions{ID: id})
	if err != nil {
		t.Fatalf("invoke %s %q: %v", tool, id, err)
	}
}

// status is what toolgate says of call id, for a failure's message.
func (p pipeline) status(t *testing.T, id string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := p.op.Status(ctx, node.DevTenant, id)
	b, _ := json.Marshal(rec)
	return fmt.Sprintf("status of %q: %s %v\n", id, b, err)
}

// registerApproved registers needs.person, every call of which waits for
// a person.
func (p pipeline) registerApproved(t *testing.T) {
	t.Helper()
	man := map[string]any{
		"id": "needs.person", "name": "needs.person", "version": "1.0.0", "description": "Echo, once a person says so.",
		"category": "utility", "kind": "builtin", "builtin": map[string]any{"function": "echo"},
		"input_schema":  map[string]any{"type": "object"},
		"output_schema": map[string]any{"type": "object"},
		"safety":        map[string]any{"risk_level": "high", "side_effects": []string{}, "requires_approval": true, "reversible": true, "idempotent": true},
		"limits":        map[string]any{"timeout_ms": 5000, "memory_mb": 128, "output_bytes": 65536},
	}
	doc, _ := json.Marshal(man)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := p.op.RegisterTool(ctx, doc, false); err != nil {
		t.Fatalf("register: %v", err)
	}
}

// consoleAt is a console served on its own loopback listener, as
// `toolgate console` serves it, and a browser signed in to it.
type consoleAt struct {
	base string
	srv  *console.Server
	jar  http.CookieJar
}

func startConsole(t *testing.T, p pipeline, cfg console.Config) consoleAt {
	t.Helper()
	var mu sync.Mutex
	var links []string
	cfg.Client, cfg.Sign, cfg.Tenants = p.op, p.op.Sign, []string{node.DevTenant}
	cfg.OnLink = func(path string) { mu.Lock(); links = append(links, path); mu.Unlock() }
	srv, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, "", "") }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("console: %v", err)
		}
	})
	c := consoleAt{base: "http://" + ln.Addr().String(), srv: srv}
	c.jar, _ = cookiejar.New(nil)
	mu.Lock()
	link := links[0]
	mu.Unlock()
	if code, _ := c.do(t, http.MethodGet, link, "", "", nil); code != http.StatusSeeOther {
		t.Fatalf("sign in: %d", code)
	}
	return c
}

// do sends a request to the console as the signed-in browser: to path
// (resolved against the console's address as a browser would), with the
// Host header host and the Origin origin when not empty. It carries the
// session's cookie whatever Host it names (a client's jar would pick
// cookies by that Host; a browser fooled by DNS rebinding has the cookie
// for the name it was shown).
func (c consoleAt) do(t *testing.T, method, path, host, origin string, form url.Values) (int, string) {
	t.Helper()
	base, _ := url.Parse(c.base + "/")
	ref, err := url.Parse(path)
	if err != nil {
		t.Fatalf("%q: %v", path, err)
	}
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, _ := http.NewRequest(method, base.ResolveReference(ref).String(), body)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if host != "" {
		req.Host = host
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	for _, ck := range c.jar.Cookies(base) {
		req.AddCookie(ck)
	}
	resp, err := (&http.Client{Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	c.jar.SetCookies(base, resp.Cookies())
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (c consoleAt) get(t *testing.T, path string) (int, string) {
	t.Helper()
	return c.do(t, http.MethodGet, path, "", "", nil)
}

// eventually polls cond until it holds or 60 s pass; then says what
// state says.
func eventually(t *testing.T, what string, cond func() bool, state func() string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %s", what, state())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var (
	timelineRow = regexp.MustCompile(`<td><a href="([^"]*)" class="ev">([^<]*)</a></td>`)
	csrfField   = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
)

// TestConsoleTimelineLinks: every row of an invocation's timeline opens
// its own event, also an event the console's window no longer holds (it
// is read again from the trail).
func TestConsoleTimelineLinks(t *testing.T) {
	p := startPipeline(t)
	id := "timeline-1"
	p.invoke(t, "echo", id)
	// A console that keeps only the last stored event of the trail: the
	// call's other events are read from the stream when opened.
	con := startConsole(t, p, console.Config{Backlog: 1})
	var body string
	eventually(t, "the call's timeline", func() bool {
		_, body = con.get(t, "/invocations/demo/"+id)
		return strings.Contains(body, "tool.succeeded")
	}, func() string { return body })
	rows := timelineRow.FindAllStringSubmatch(body, -1)
	if len(rows) < 2 {
		t.Fatalf("the timeline has %d rows:\n%s", len(rows), body)
	}
	seen := map[string]bool{}
	for _, r := range rows {
		href, typ := html.UnescapeString(r[1]), r[2]
		if seen[href] {
			t.Errorf("two rows link %s", href)
		}
		seen[href] = true
		code, page := con.get(t, href)
		if code != http.StatusOK || !strings.Contains(page, id) || !strings.Contains(page, typ) {
			t.Fatalf("the timeline row %s links %s: %d\n%s", typ, href, code, page)
		}
	}
	// No event at sequence 0, nor past the end of the stream.
	for _, seq := range []string{"0", "999999"} {
		if code, page := con.get(t, "/audit/event/"+seq); code != http.StatusNotFound {
			t.Fatalf("/audit/event/%s: %d\n%s", seq, code, page)
		}
	}
}

// TestConsoleOddIDs: a call whose id holds a slash, a query or fragment
// mark, a percent sign, a space, a letter beyond ASCII or is a dot
// segment is listed, opened and decided from the inbox's own links.
func TestConsoleOddIDs(t *testing.T) {
	p := startPipeline(t)
	p.registerApproved(t)
	con := startConsole(t, p, console.Config{})
	ids := []string{"odd/slash", "odd?q=1#frag", "odd%2F 100% ü", "..", ".", "odd/../up", "odd//twice/"}
	for _, id := range ids {
		p.invoke(t, "needs.person", id)
	}
	var inbox string
	eventually(t, "every call in the inbox", func() bool {
		_, inbox = con.get(t, "/")
		return strings.Count(inbox, `class="approval"`) == len(ids)
	}, func() string { return p.status(t, ids[0]) + inbox })
	csrf := csrfField.FindStringSubmatch(inbox)[1]
	for _, id := range ids {
		esc := regexp.QuoteMeta(html.EscapeString(id))
		card := regexp.MustCompile(`(?s)<article class="approval" id="approval-` + esc + `".*?</article>`).FindString(inbox)
		if card == "" {
			t.Fatalf("no card for %q:\n%s", id, inbox)
		}
		open := regexp.MustCompile(`<a href="([^"]*)">` + esc + `</a>`).FindStringSubmatch(card)
		action := regexp.MustCompile(`action="([^"]*)"`).FindStringSubmatch(card)
		digest := regexp.MustCompile(`name="digest" value="([^"]*)"`).FindStringSubmatch(card)
		if open == nil || action == nil || digest == nil {
			t.Fatalf("the card of %q has no link, form or digest:\n%s", id, card)
		}
		code, page := con.get(t, html.UnescapeString(open[1]))
		if code != http.StatusOK || !strings.Contains(page, "<h1>Invocation <code>"+html.EscapeString(id)+"</code></h1>") ||
			!strings.Contains(page, "needs.person") {
			t.Fatalf("opening %q at %s: %d\n%s", id, open[1], code, page)
		}
		code, page = con.do(t, http.MethodPost, html.UnescapeString(action[1]), "", con.base,
			url.Values{"csrf": {csrf}, "digest": {digest[1]}, "decision": {"approve"}})
		if code != http.StatusOK || !strings.Contains(page, "approved "+html.EscapeString(id)+" ") {
			t.Fatalf("approving %q at %s: %d\n%s", id, action[1], code, page)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		a, err := p.op.Approval(ctx, node.DevTenant, id)
		cancel()
		if err != nil || a.State != "approved" {
			t.Fatalf("%q after approving: %+v %v", id, a, err)
		}
	}
}

// TestConsoleHostAllowList: a request whose Host the console does not
// serve is refused before anything else, even a decision with the
// session's cookie, its CSRF token and an Origin naming that same foreign
// host (DNS rebinding); names given in AllowHosts are served, and the
// Origin must be one of the console's names.
func TestConsoleHostAllowList(t *testing.T) {
	p := startPipeline(t)
	p.registerApproved(t)
	con := startConsole(t, p, console.Config{AllowHosts: []string{"console.example", "ops.example:9443"}})
	id := "rebound-1"
	p.invoke(t, "needs.person", id)
	var inbox string
	eventually(t, "the call in the inbox", func() bool {
		_, inbox = con.get(t, "/")
		return strings.Contains(inbox, `id="approval-`+id+`"`)
	}, func() string { return p.status(t, id) + inbox })
	csrf := csrfField.FindStringSubmatch(inbox)[1]
	digest := regexp.MustCompile(`name="digest" value="([^"]*)"`).FindStringSubmatch(inbox)[1]
	port := strings.TrimPrefix(con.base, "http://127.0.0.1:")
	decide := "/approvals/demo/" + id
	form := url.Values{"csrf": {csrf}, "digest": {digest}, "decision": {"approve"}}

	for _, host := range []string{"evil.example:" + port, "evil.example", "127.0.0.1.evil.example:" + port, "ops.example:" + port, "console.example.evil:" + port} {
		code, body := con.do(t, http.MethodPost, decide, host, "http://"+host, form)
		if code != http.StatusForbidden || !strings.Contains(body, "Host") {
			t.Fatalf("a decision with Host and Origin %s: %d\n%s", host, code, body)
		}
		if code, body := con.do(t, http.MethodGet, "/", host, "", nil); code != http.StatusForbidden || strings.Contains(body, "<html") {
			t.Fatalf("the inbox with Host %s: %d\n%s", host, code, body)
		}
	}
	// An allowed Host with a foreign Origin is still refused.
	if code, _ := con.do(t, http.MethodPost, decide, "", "http://evil.example:"+port, form); code != http.StatusForbidden {
		t.Fatalf("a decision from a foreign origin: %d", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if a, err := p.op.Approval(ctx, node.DevTenant, id); err != nil || a.State != "pending" {
		t.Fatalf("after the refused decisions: %+v %v", a, err)
	}
	// The console's own names: the listen address, localhost with its
	// port, and the allowed ones.
	for _, host := range []string{"localhost:" + port, "[::1]:" + port, "CONSOLE.example:" + port, "console.example", "ops.example:9443"} {
		if code, body := con.do(t, http.MethodGet, "/", host, "", nil); code != http.StatusOK || !strings.Contains(body, "<h1>Approvals</h1>") {
			t.Fatalf("the inbox with Host %s: %d\n%s", host, code, body)
		}
	}
	code, body := con.do(t, http.MethodPost, decide, "console.example:"+port, "http://console.example:"+port, form)
	if code != http.StatusOK || !strings.Contains(body, "approved "+id) {
		t.Fatalf("a decision from an allowed name: %d\n%s", code, body)
	}
}

// TestConsoleOverviewByRole: the overview shows the breakers and budgets
// panels only to credentials the bus lets read them. An approver's
// console (the usual one) leaves them out, with no refusal text; the
// operator's (--allow-admin) shows them.
func TestConsoleOverviewByRole(t *testing.T) {
	p := startPipeline(t)
	keys, err := busauth.LoadKeys(p.dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := keys.IssueCredentials(busauth.RoleApprover, "alice", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(t.TempDir(), "alice.creds")
	if err := busauth.WriteCredsFiles(creds, b); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(p.url, busauth.CredentialsOption(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	approver, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		client *client.Client
		shown  bool
	}{{"approver", approver, false}, {"operator", p.op, true}} {
		t.Run(c.name, func(t *testing.T) {
			cp := p
			cp.op = c.client
			con := startConsole(t, cp, console.Config{})
			code, body := con.do(t, http.MethodGet, "/overview", "", "", nil)
			if code != http.StatusOK {
				t.Fatalf("overview: %d %s", code, body)
			}
			for _, panel := range []string{"Open breakers", "Budgets near their limit"} {
				if strings.Contains(body, panel) != c.shown {
					t.Errorf("panel %q shown: %v, want %v", panel, !c.shown, c.shown)
				}
			}
			if strings.Contains(body, api.EBusNotPermitted) || strings.Contains(body, "refused") {
				t.Errorf("the overview shows the bus's refusal:\n%s", body)
			}
		})
	}
}
