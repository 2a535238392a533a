package main

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/toolgate/toolgate/api"
)

// chromium finds a Chromium or Chrome to drive.
func chromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// TestConsoleBrowser drives a real Chromium through the console: sign in
// with the login link, see a parked call appear live, approve it and see
// it finish with its timeline, deny another, see a third vanish when
// someone else decides it first, pause and resume the live audit, decide
// too late and be told E3215, and find the parameter full of HTML and
// script shown as text with no script run; click a timeline row and land
// on its event; open and approve a call whose id holds slashes; and see a
// decision the session's cookie carries to the console under a name of
// another site (DNS rebinding) refused. With -update it writes the
// screenshots docs/console.md shows.
func TestConsoleBrowser(t *testing.T) {
	exe := chromium()
	if exe == "" {
		t.Skip("no chromium found on PATH (apt-get install chromium): the console's browser test needs one")
	}
	cleanEnv(t)
	s := startToolgate(t)
	registerConsoleTool(t, s)
	con := startConsole(t, s)

	alloc, cancel := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1280, 900),
		// A name of another site that resolves to the console's address.
		chromedp.Flag("host-resolver-rules", "MAP rebound.example 127.0.0.1"))...)
	defer cancel()
	browser, cancel := chromedp.NewContext(alloc)
	defer cancel()
	// The first run starts the browser, on a context without a deadline
	// (a deadline there would end the browser); each step has its own.
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("starting %s: %v", exe, err)
	}
	shot := func(name string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			if !*update {
				return nil
			}
			png, err := chromedp.FullScreenshot(100)(ctx, tg)
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join("..", "..", "docs", "console-"+name+".png"), png, 0o644)
		})
	}
	step := func() (context.Context, context.CancelFunc) { return context.WithTimeout(browser, 30*time.Second) }
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		ctx, cancel := step()
		defer cancel()
		if err := chromedp.Do(ctx, actions...); err != nil {
			page, _ := chromedp.Run(browser, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText`))
			t.Fatalf("%s: %v\nthe page:\n%s", what, err, page)
		}
	}
	text := func(sel string) string {
		t.Helper()
		ctx, cancel := step()
		defer cancel()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	eval := func(expr string) any {
		t.Helper()
		ctx, cancel := step()
		defer cancel()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[any](expr))
		if err != nil {
			t.Fatalf("evaluating %s: %v", expr, err)
		}
		return v
	}
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }

	run("sign in", chromedp.Navigate(con.links()[0]), chromedp.WaitVisible(css("#no-approvals")))

	// A call parks while the inbox is open: it appears without a reload.
	id := "console-browser-1"
	finished := parkCall(t, s, id)
	card := "#approval-" + id
	run("see the parked call", chromedp.WaitVisible(css(card)), shot("inbox"))
	params := text(card + " pre.params")
	pwned := eval(`window.__pwned === 1 || document.querySelector("#inbox img, #inbox script, #inbox a[href^=javascript]") !== null`) != false
	if pwned || !strings.Contains(params, "<script>window.__pwned=1</script>") || strings.Contains(params, "hunter2") {
		t.Fatalf("the hostile parameter: ran %v, shown as %q", pwned, params)
	}
	run("approve", chromedp.SendKeys(css(card+" input[name=reason]"), "checked with the requester"),
		chromedp.Click(css(card+" button.approve")), chromedp.WaitVisible(css("#notice")))
	notice := text("#notice")
	if !strings.Contains(notice, "approved "+id) {
		t.Fatalf("notice after approving: %q", notice)
	}
	select {
	case code := <-finished:
		if code != exitOK {
			t.Fatalf("the approved call ended with exit %d", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the approved call did not finish")
	}
	// The record ends a moment before the terminal event is stored: the
	// page stays live until the trail has it too.
	run("see it finish", chromedp.Navigate(con.base+"/invocations/demo/"+id), chromedp.WaitVisible(css("#status.status-success")),
		chromedp.WaitNotPresent(css("#status[data-live]")), shot("invocation"))
	timeline := text("#timeline")
	pwned = eval(`window.__pwned === 1`) != false
	for _, want := range []string{"tool.approval.requested", "tool.approval.granted", "tool.succeeded"} {
		if !strings.Contains(timeline, want) {
			t.Fatalf("the timeline lacks %s:\n%s", want, timeline)
		}
	}
	if pwned {
		t.Fatal("a script from the parameters ran on the invocation page")
	}
	// A timeline row opens its own event.
	for i := range 3 {
		run("back to the timeline", chromedp.Navigate(con.base+"/invocations/demo/"+id), chromedp.WaitVisible(css("#timeline")))
		row := eval(`document.querySelectorAll("#timeline a.ev")[` + string(rune('0'+i)) + `].textContent`).(string)
		run("open timeline row "+row, chromedp.Click(css("#timeline tbody tr:nth-child("+string(rune('1'+i))+") a.ev")),
			chromedp.WaitVisible(css("pre.raw")))
		where := eval(`location.pathname`).(string)
		if h1 := text("h1"); !regexp.MustCompile(`^/audit/event/[1-9][0-9]*$`).MatchString(where) || h1 != "Audit event "+row ||
			!strings.Contains(text("pre.raw"), id) {
			t.Fatalf("the timeline row %s opened %s: %q", row, where, h1)
		}
	}

	// Deny another.
	id2 := "console-browser-2"
	denied := parkCall(t, s, id2)
	run("deny", chromedp.Navigate(con.base+"/"), chromedp.WaitVisible(css("#approval-"+id2)),
		chromedp.Click(css("#approval-"+id2+" button.deny")), chromedp.WaitVisible(css("#notice")))
	notice = text("#notice")
	if !strings.Contains(notice, "denied "+id2) {
		t.Fatalf("notice after denying: %q", notice)
	}
	select {
	case code := <-denied:
		if code != exitDenied {
			t.Fatalf("the denied call ended with exit %d", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the denied call did not end")
	}

	// Someone else decides first: the open inbox drops the call by itself.
	id3 := "console-browser-3"
	third := parkCall(t, s, id3)
	run("see the third", chromedp.Navigate(con.base+"/"), chromedp.WaitVisible(css("#approval-"+id3)))
	if r := tg(t, "", s.flags("approve", id3, "--reason", "from the terminal")...); r.code != exitOK {
		t.Fatalf("approve from the CLI: exit %d %s", r.code, r.stderr)
	}
	run("see it vanish", chromedp.WaitNotPresent(css("#approval-"+id3)))
	<-third

	// Someone decides while this person is writing a reason: the card
	// stays (the list waits for the writing), and the late decision
	// says plainly that the first one counted.
	id5 := "console-browser-5"
	fifth := parkCall(t, s, id5)
	card5 := "#approval-" + id5
	run("start writing", chromedp.Navigate(con.base+"/"), chromedp.WaitVisible(css(card5)),
		chromedp.SendKeys(css(card5+" input[name=reason]"), "fine by me"))
	if r := tg(t, "", s.flags("deny", id5, "--reason", "first")...); r.code != exitOK {
		t.Fatalf("deny from the CLI: exit %d %s", r.code, r.stderr)
	}
	<-fifth
	run("decide late", chromedp.Click(css(card5+" button.approve")), chromedp.WaitVisible(css("#failure")))
	if f := text("#failure"); !strings.Contains(f, "E3215") || !strings.Contains(f, "already denied") {
		t.Fatalf("the late decision says %q", f)
	}

	// A call whose id holds slashes opens and is decided from the inbox.
	id6 := "console/browser/6 ?#%"
	sixth := parkCall(t, s, id6)
	card6 := `article[data-id="console/browser/6 ?#%"]`
	run("open the call with slashes", chromedp.Navigate(con.base+"/"), chromedp.WaitVisible(css(card6)),
		chromedp.Click(css(card6+" dd a")), chromedp.WaitVisible(css("#timeline")))
	if h1 := text("h1"); h1 != "Invocation "+id6 {
		t.Fatalf("opening %q from the inbox shows %q at %v", id6, h1, eval(`location.href`))
	}
	run("approve the call with slashes", chromedp.Navigate(con.base+"/"), chromedp.WaitVisible(css(card6)),
		chromedp.Click(css(card6+" button.approve")), chromedp.WaitVisible(css("#notice")))
	if notice := text("#notice"); !strings.Contains(notice, "approved "+id6) {
		t.Fatalf("notice after approving %q: %q", id6, notice)
	}
	if code := <-sixth; code != exitOK {
		t.Fatalf("the approved call %q ended with exit %d", id6, code)
	}

	// DNS rebinding: a page of rebound.example, a name that resolves to the
	// console's address, holding the session's cookie, the page's CSRF
	// token and the request digest, posts a decision; its Origin matches
	// its Host. The console answers neither the page nor the decision.
	id7 := "console-browser-7"
	seventh := parkCall(t, s, id7)
	card7 := "#approval-" + id7
	run("see the seventh", chromedp.Navigate(con.base+"/"), chromedp.WaitVisible(css(card7)))
	form := eval(`JSON.stringify({csrf: document.querySelector("` + card7 + ` input[name=csrf]").value, digest: document.querySelector("` + card7 + ` input[name=digest]").value})`).(string)
	u, _ := url.Parse(con.base)
	rebound := "http://rebound.example:" + u.Port()
	run("carry the session's cookie to rebound.example", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		got, err := cdp.Call(ctx, tg, network.GetCookies, network.GetCookiesParams{URLs: []string{con.base + "/"}})
		if err != nil {
			return err
		}
		for _, c := range got.Cookies {
			if _, err := cdp.Call(ctx, tg, network.SetCookie, network.SetCookieParams{Name: c.Name, Value: c.Value, URL: rebound + "/", Path: "/"}); err != nil {
				return err
			}
		}
		return nil
	}), chromedp.Navigate(rebound+"/"), chromedp.WaitVisible(css("body")))
	if body := text("body"); !strings.Contains(body, "refused") || strings.Contains(body, id7) {
		t.Fatalf("the inbox under rebound.example:\n%s", body)
	}
	ctx, cancel := step()
	status, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`(async () => { const f = `+form+`; const r = await fetch("/approvals/demo/`+id7+`", {method: "POST", credentials: "include",
		body: new URLSearchParams({csrf: f.csrf, digest: f.digest, decision: "approve"})}); return r.status; })()`, chromedp.EvalAwaitPromise))
	cancel()
	if err != nil || status != 403 {
		t.Fatalf("a decision posted from rebound.example: %v %v", status, err)
	}
	r := tg(t, "", s.flags("approvals", "show", id7, "--json")...)
	var a7 api.ApprovalSummary
	if err := json.Unmarshal([]byte(r.stdout), &a7); err != nil || a7.State != "pending" {
		t.Fatalf("after the rebound decision the approval is %q (%v)", a7.State, err)
	}
	if r := tg(t, "", s.flags("deny", id7)...); r.code != exitOK {
		t.Fatalf("deny from the CLI: exit %d %s", r.code, r.stderr)
	}
	<-seventh

	run("live audit", chromedp.Navigate(con.base+"/audit?tool=needs.human"), chromedp.WaitVisible(css("#events tr")), shot("audit"))
	if rows, _ := eval(`document.querySelectorAll("#events tr").length`).(float64); rows < 3 {
		t.Fatalf("the audit view shows too few events of needs.human")
	}
	// Pause holds new events back; Resume shows them.
	before := eval(`document.querySelectorAll("#events tr").length`)
	run("pause", chromedp.Click(css("#pause")))
	id4 := "console-browser-4"
	fourth := parkCall(t, s, id4)
	run("see events held", chromedp.WaitVisible(css("#live-state.held")))
	if now := eval(`document.querySelectorAll("#events tr").length`); now != before {
		t.Fatalf("paused, the audit view still grew from %v to %v rows", before, now)
	}
	run("resume", chromedp.Click(css("#pause")), chromedp.WaitVisible(css("#events tr[data-id='"+id4+"']")))
	if r := tg(t, "", s.flags("deny", id4)...); r.code != exitOK {
		t.Fatalf("deny from the CLI: exit %d %s", r.code, r.stderr)
	}
	<-fourth

	// A session that spent four of its five calls is near its limit.
	spendBudget(t, s, "browser-budget", 5, 4)
	run("overview", chromedp.Navigate(con.base+"/overview"), chromedp.WaitVisible(css("#top-tools")),
		chromedp.WaitVisible(css("#budgets")), shot("overview"))
	if b := text("#budgets"); !strings.Contains(b, "token:browser-budget") || !strings.Contains(b, "4 of 5 (80%)") {
		t.Fatalf("the overview's budgets near their limit:\n%s", b)
	}
}
