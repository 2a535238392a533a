package chaos

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/subjects"
)

// proc is one toolgate process of the sites test, in its own process
// group, started and SIGKILLed for real.
type proc struct {
	t       *testing.T
	args    []string
	log     string
	metrics string
	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
}

func newProc(t *testing.T, log string, args ...string) *proc {
	p := &proc{t: t, log: log, metrics: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	p.args = append(args, "--metrics-addr", p.metrics, "--log-level", "warn", "--sandbox", "none")
	t.Cleanup(p.kill)
	return p
}

// start runs the process; ready waits for its /readyz.
func (p *proc) start() {
	p.t.Helper()
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		p.t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "toolgate"), p.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
}

func (p *proc) ready() bool { return readyz(p.metrics) }

func (p *proc) waitReady(d time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for !p.ready() {
		if time.Now().After(deadline) {
			p.t.Fatalf("%s not ready after %v; log:\n%s", filepath.Base(p.log), d, tailFile(p.log, 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// signal sends sig to the process group.
func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// kill SIGKILLs the process group and reaps it.
func (p *proc) kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// siteTool is fs.append_file renamed id, run at site: each run appends
// the invocation id to the ledger under its site's file root.
func siteTool(t *testing.T, id, site string) []byte {
	ms, err := tools.Examples()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.ID != "fs.append_file" {
			continue
		}
		m.ID, m.Site = id, site
		m.RateLimit = &tools.RateLimit{Requests: 1_000_000, PerSeconds: 1, Burst: 1_000_000}
		m.Limits.ConcurrentPerAgent = tools.UncountedRuns
		doc, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return doc
	}
	t.Fatal("no example fs.append_file")
	return nil
}

// ledgerCounts counts each id's lines in a site's ledger.
func ledgerCounts(t *testing.T, root string) map[string]int {
	t.Helper()
	out := map[string]int{}
	f, err := os.Open(filepath.Join(root, ledger))
	if errors.Is(err, os.ErrNotExist) {
		return out
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out[l]++
		}
	}
	return out
}

// TestSitesLeafNodes runs a hub and two sites as separate toolgate
// processes, each site's embedded server a leaf node of the hub's, as
// deployed (docs/sites.md). A site's tool runs at its site and nowhere
// else; a site cut off (SIGKILL) during load leaves its calls waiting at
// the hub, and when it is back they run once each; the hub killed while a
// site's calls wait loses none; a site's credentials serve no other
// site's calls and open no client connection (refused, audited); a
// manifest naming an undeclared site is refused (E3270).
// siteRate is the hub's --site-rate in TestSitesLeafNodes: half the
// default, so that the flag shows in how long a flood takes to drain.
const siteRate = 250

func TestSitesLeafNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	binaries(t)
	dir := t.TempDir()
	roots := map[string]string{}
	for _, n := range []string{"hub", "lab-eu", "lab-us"} {
		roots[n] = filepath.Join(dir, "files-"+n)
		if err := os.MkdirAll(roots[n], 0o755); err != nil {
			t.Fatal(err)
		}
	}
	jwks := filepath.Join(dir, "jwks.json")
	k := keySet(t, jwks)
	agent := "did:agent:sites"
	tok, err := token.Mint(k, token.Claims{
		ToolID: token.Patterns{"eu.append_file", "us.append_file", "hub.append_file"}, TenantID: tenant, AgentDID: agent,
		Filesystem: &token.FilesystemGrant{AllowedPaths: []string{"/"}, Mode: "rw"},
		RegisteredClaims: jwt.RegisteredClaims{Issuer: issuer, Audience: jwt.ClaimStrings{audience},
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))},
	})
	if err != nil {
		t.Fatal(err)
	}

	hubData := filepath.Join(dir, "hub")
	port, leafPort := freePort(t), freePort(t)
	hubURL := fmt.Sprintf("nats://127.0.0.1:%d", port)
	hub := newProc(t, filepath.Join(dir, "hub.log"), "serve", "--data", hubData,
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--leaf-listen", fmt.Sprintf("127.0.0.1:%d", leafPort),
		"--sync", "interval", "--jwks", jwks, "--token-issuer", issuer, "--token-audience", audience,
		"--file-root", roots["hub"], "--ack-wait", ackWait.String(), "--site-rate", strconv.Itoa(siteRate))
	hub.start()
	hub.waitReady(time.Minute)

	tg := func(args ...string) (string, error) {
		out, err := exec.Command(filepath.Join(binDir, "toolgate"), append([]string{"--data", hubData, "--nats", hubURL}, args...)...).CombinedOutput()
		return string(out), err
	}
	sites := map[string]*proc{}
	bundles := map[string]string{}
	for _, s := range []string{"lab-eu", "lab-us"} {
		bundles[s] = filepath.Join(dir, s+"-bundle")
		if out, err := tg("site", "add", s, "--out", bundles[s]); err != nil {
			t.Fatalf("site add %s: %v\n%s", s, err, out)
		}
		sites[s] = newProc(t, filepath.Join(dir, s+".log"), "serve", "--site", s,
			"--hub", fmt.Sprintf("nats-leaf://127.0.0.1:%d", leafPort), "--data", bundles[s],
			"--file-root", roots[s], "--ack-wait", ackWait.String())
		sites[s].start()
	}
	for _, s := range sites {
		s.waitReady(time.Minute)
	}

	creds := node.CredsPath(hubData, busauth.RoleOperator)
	nc, err := nats.Connect(hubURL, busauth.CredentialsOption(creds), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	op := operatorClient(t, nc, creds)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	register := func() {
		t.Helper()
		for id, site := range map[string]string{"eu.append_file": "lab-eu", "us.append_file": "lab-us", "hub.append_file": ""} {
			if _, err := op.RegisterTool(ctx, siteTool(t, id, site), true); err != nil {
				t.Fatalf("registering %s: %v", id, err)
			}
		}
		// The control service answers once its own registry holds the
		// tools; validate's follows the bucket by a watch of its own.
		time.Sleep(2 * time.Second)
	}
	register()
	_, err = op.RegisterTool(ctx, siteTool(t, "nowhere.append_file", "nowhere"), true)
	if !errors.Is(err, &api.Error{Code: api.InvalidParameters, ECode: api.EUnknownSite}) {
		t.Fatalf("a manifest naming an undeclared site: %v, want E3270", err)
	}

	seq := 0
	invoke := func(toolID string) string {
		t.Helper()
		seq++
		id := fmt.Sprintf("%s-%04d", strings.Split(toolID, ".")[0], seq)
		req := api.Request{ToolID: toolID, CapabilityToken: tok,
			AgentContext: api.AgentContext{AgentDID: agent, TenantID: tenant},
			Parameters:   json.RawMessage(fmt.Sprintf(`{"path":%q,"content":"%s\n"}`, ledger, id))}
		for {
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := op.Invoke(pctx, req, client.InvokeOptions{ID: id})
			pcancel()
			if err == nil {
				return id
			}
			if ctx.Err() != nil {
				t.Fatalf("invoking %s: %v", id, err)
			}
			time.Sleep(200 * time.Millisecond) // the hub restarting: the same id again
		}
	}
	// interrupted are the calls a site's SIGKILL caught mid-run: not
	// idempotent, they end E3023 and are never run again (at most once).
	interrupted := map[string]bool{}
	waitAll := func(ids []string) {
		t.Helper()
		for _, id := range ids {
			r, err := op.Wait(ctx, tenant, id)
			if err != nil {
				t.Fatalf("waiting for %s: %v", id, err)
			}
			if r.Status != api.StatusSuccess {
				if r.Error != nil && r.Error.ECode == api.EOutcomeUnknown {
					interrupted[id] = true
					continue
				}
				t.Fatalf("%s ended %s: %+v", id, r.Status, r.Error)
			}
		}
	}
	// once checks that each id of site ran exactly once (an interrupted
	// one at most once), at its site only.
	once := func(site string, ids []string) {
		t.Helper()
		got := ledgerCounts(t, roots[site])
		for _, id := range ids {
			if got[id] != 1 && !(interrupted[id] && got[id] == 0) {
				t.Errorf("%s ran %d times at %s, want once", id, got[id], site)
			}
		}
		for other, root := range roots {
			if other == site {
				continue
			}
			for _, id := range ids {
				if n := ledgerCounts(t, root)[id]; n != 0 {
					t.Errorf("%s (a %s tool) ran %d times at %s", id, site, n, other)
				}
			}
		}
	}
	siteList := func() map[string]map[string]any {
		t.Helper()
		out, err := tg("--json", "site", "list")
		if err != nil {
			t.Fatalf("site list: %v\n%s", err, out)
		}
		var l struct {
			Sites []map[string]any `json:"sites"`
		}
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			t.Fatalf("site list: %v\n%s", err, out)
		}
		m := map[string]map[string]any{}
		for _, s := range l.Sites {
			m[s["site"].(string)] = s
		}
		return m
	}

	// 1. Each site's tool runs at its site.
	var eu, us []string
	for range 10 {
		eu, us = append(eu, invoke("eu.append_file")), append(us, invoke("us.append_file"))
	}
	waitAll(append(append([]string{}, eu...), us...))
	once("lab-eu", eu)
	once("lab-us", us)
	if l := siteList(); l["lab-eu"]["link"] != "up" || l["lab-us"]["link"] != "up" {
		t.Errorf("site list with both sites running: %v", l)
	}
	// The hub's metrics say each site's state; a site's carry its name.
	if m := scrape(t, hub.metrics); !strings.Contains(m, `toolgate_site_up{site="lab-eu"} 1`) || !strings.Contains(m, `toolgate_site_queued{site="lab-us"} 0`) {
		t.Errorf("the hub's metrics lack the sites' state:\n%s", grepLines(m, "toolgate_site_"))
	}
	if m := scrape(t, sites["lab-eu"].metrics); !strings.Contains(m, `site="lab-eu"`) {
		t.Errorf("lab-eu's metrics do not name it")
	}

	// 2. lab-eu cut off during load: its calls wait at the hub and run
	// once each when it is back; lab-us goes on meanwhile.
	var cut []string
	for i := range 30 {
		if i == 10 {
			sites["lab-eu"].kill()
		}
		cut = append(cut, invoke("eu.append_file"))
	}
	usDuring := []string{invoke("us.append_file")}
	waitAll(usDuring)
	time.Sleep(time.Second)
	l := siteList()
	if l["lab-eu"]["link"] != "down" || l["lab-eu"]["queued"].(float64)+l["lab-eu"]["running"].(float64) == 0 {
		t.Errorf("site list while lab-eu is cut off: %v, want it down with calls waiting", l["lab-eu"])
	}
	// Its status names the site it waits for and that site's link.
	if r, err := op.Status(ctx, tenant, cut[len(cut)-1]); err != nil || r.Status.Terminal() {
		t.Errorf("a call for the cut-off site: %v %v, want it waiting", r.Status, err)
	} else if r.Site == nil || r.Site.Site != "lab-eu" || r.Site.Link != "down" || r.Site.LastContact == nil {
		t.Errorf("the status of a call waiting for the cut-off lab-eu: site %+v, want lab-eu, link down since its last contact", r.Site)
	}
	sites["lab-eu"].start()
	waitAll(cut)
	once("lab-eu", append(eu, cut...))
	t.Logf("link cut: %d calls waited for lab-eu, %d caught mid-run (E3023, not run again)", len(cut), len(interrupted))
	once("lab-us", append(us, usDuring...))

	// 3. The hub killed while lab-us's calls wait for it: none lost.
	sites["lab-us"].kill()
	var queued []string
	for range 10 {
		queued = append(queued, invoke("us.append_file"))
	}
	hub.kill()
	hub.start()
	hub.waitReady(time.Minute)
	register() // serve registers its own examples at start; ours stay, replaced alike
	sites["lab-us"].start()
	waitAll(queued)
	once("lab-us", append(append(us, usDuring...), queued...))

	// 4. lab-eu's credentials do not take lab-us's calls: a process that
	// calls itself lab-us with them gets no call, and the call waits for
	// the real lab-us.
	sites["lab-us"].kill()
	impostor := newProc(t, filepath.Join(dir, "impostor.log"), "serve", "--site", "lab-us",
		"--hub", fmt.Sprintf("nats-leaf://127.0.0.1:%d", leafPort), "--data", bundles["lab-eu"],
		"--file-root", roots["lab-eu"], "--ack-wait", ackWait.String())
	impostor.start()
	stolen := invoke("us.append_file")
	time.Sleep(5 * time.Second)
	if impostor.ready() {
		t.Error("a site running with another site's credentials became ready")
	}
	if r, err := op.Status(ctx, tenant, stolen); err != nil || r.Status.Terminal() {
		t.Errorf("lab-us's call with lab-eu's credentials posing as lab-us: %v %v, want it still waiting", r.Status, err)
	}
	if n := ledgerCounts(t, roots["lab-eu"])[stolen]; n != 0 {
		t.Errorf("lab-us's call ran %d times at lab-eu", n)
	}
	impostor.kill()
	// lab-eu's credentials and key, with a copy of lab-us's waiting call,
	// hand verify a result of it and audit an ending of it: both refused
	// (the site's hand-off E3272, its ending E3230) and audited, and the
	// real call still runs at lab-us and ends once.
	forgeAsSite(t, ctx, nc, leafPort, bundles["lab-eu"], "lab-eu", stolen)
	// Nor do they read or delete it by its sequence in the pipeline: the
	// hub sweeps the sites' consumers, and grants a site no such request.
	sweepAsSite(t, ctx, nc, leafPort, bundles["lab-eu"], "lab-eu", stolen)
	sites["lab-us"].start()
	waitAll([]string{stolen})
	once("lab-us", []string{stolen})
	if r, err := op.Status(ctx, tenant, stolen); err != nil || r.Status != api.StatusSuccess {
		t.Errorf("lab-us's call after lab-eu's forgeries: %v %v", r.Status, err)
	} else if b, _ := json.Marshal(r); strings.Contains(string(b), "forged") {
		t.Errorf("lab-us's call ended with lab-eu's forgery: %s", b)
	}
	// A leaf link that asks for what its grant refuses is cut, and the
	// refusal audited (the site's own server never asks: a raw link does).
	if reply := rawLeafViolation(t, leafPort, filepath.Join(bundles["lab-eu"], busauth.DirName, busauth.SiteCredsFile)); !strings.Contains(reply, "Permissions Violation") {
		t.Errorf("a leaf link subscribing outside its grant: %q, want a permissions violation", reply)
	}
	if !auditedRefusal(t, ctx, nc, "leaf link refused") {
		t.Error("no bus.refused audit event for the leaf link's violation")
	}
	// The hub's forwarder judged them as verify and audit would, and
	// dropped them: the trail has its summary (E3277), not one event each.
	if !auditedAdmin(t, ctx, nc, "state.refused", "site:lab-eu/calls", api.ESiteRefusedSummary, stolen) {
		t.Errorf("no state.refused %s for lab-eu's forgery of %s", api.ESiteRefusedSummary, stolen)
	}
	for _, code := range []string{api.ESiteHandOffRefused, api.EEndingRefused} {
		if auditedPoison(t, ctx, nc, stolen, code, 0) {
			t.Errorf("lab-eu's forgery of %s reached the readers: pipeline.poison %s", stolen, code)
		}
	}

	// 5. A site's credentials open no client connection to the hub: only
	// its leaf link; the refusal is in the audit trail.
	_, err = nats.Connect(hubURL, busauth.CredentialsOption(filepath.Join(bundles["lab-eu"], busauth.DirName, busauth.SiteCredsFile)),
		nats.MaxReconnects(0))
	if err == nil {
		t.Fatal("a site's credentials opened a client connection to the hub")
	}
	if !auditedRefusal(t, ctx, nc, "site credentials on a client connection") {
		t.Fatal("no bus.refused audit event for the site's client connection")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	refusal := subjects.AuditEvent(subjects.SystemTenant, "bus.refused")

	// 6. lab-eu floods its outbox: thousands of messages as fast as it
	// can. Its outbox's bound refuses most, the hub forwards none it did
	// not sign and says so (metric, one audited state.refused), and
	// lab-us's calls still end, within a bound printed here.
	floodStart := time.Now()
	refusedFlood, acceptedFlood := floodAsSite(t, ctx, leafPort, bundles["lab-eu"], "lab-eu", 6000)
	var during []string
	for range 10 {
		during = append(during, invoke("us.append_file"))
	}
	waitAll(during)
	took := time.Since(floodStart)
	once("lab-us", during)
	t.Logf("flood: lab-eu sent 6000 messages, %d refused at its outbox's bound, %d held; 10 calls of lab-us meanwhile ended in %v",
		refusedFlood, acceptedFlood, took.Round(time.Millisecond))
	if refusedFlood == 0 {
		t.Error("lab-eu's flood of its outbox was not bounded: nothing refused")
	}
	if took > 45*time.Second {
		t.Errorf("lab-us's calls took %v during lab-eu's flood", took)
	}
	if !auditedAdmin(t, ctx, nc, "state.refused", "site:lab-eu/outbox", api.ESiteFlood) {
		t.Error("no audited state.refused for lab-eu's full outbox")
	}
	if m := scrape(t, hub.metrics); !strings.Contains(m, `toolgate_site_outbox_full_total{site="lab-eu"}`) ||
		!strings.Contains(m, `toolgate_site_dropped_total{reason="signature",site="lab-eu"}`) {
		t.Errorf("the hub's metrics do not show lab-eu's flood:\n%s", grepLines(m, "toolgate_site_"))
	}
	junk := 0
	if err := readStream(ctx, js, subjects.StreamAudit, subjects.AuditAll, func(m jetstream.Msg) {
		if strings.Contains(string(m.Data()), "flood-junk") {
			junk++
		}
	}); err != nil {
		t.Fatal(err)
	}
	if junk > 0 {
		t.Errorf("%d messages of lab-eu's flood reached the audit trail", junk)
	}
	// lab-eu signs its flood, of hand-offs and endings of calls it never
	// got: the hub drops each before verify or audit reads it, and the
	// trail has a summary of them, not one event each, while lab-us's
	// calls and the hub's own end.
	const signed = 1000
	signedStart := time.Now()
	var hubCalls []string
	during = nil
	sent := signedFloodAsSite(t, ctx, leafPort, bundles["lab-eu"], "lab-eu", signed)
	for range 5 {
		during, hubCalls = append(during, invoke("us.append_file")), append(hubCalls, invoke("hub.append_file"))
	}
	waitAll(append(append([]string{}, during...), hubCalls...))
	took = time.Since(signedStart)
	once("lab-us", during)
	once("hub", hubCalls)
	dropped := func() float64 {
		return metricValue(scrape(t, hub.metrics), `toolgate_site_dropped_total{reason="call",site="lab-eu"}`)
	}
	for deadline := time.Now().Add(40 * time.Second); dropped() < float64(sent) && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	drained := time.Since(signedStart)
	trail := 0
	if err := readStream(ctx, js, subjects.StreamAudit, subjects.AuditAll, func(m jetstream.Msg) {
		if strings.Contains(string(m.Data()), "signed-flood-") {
			trail++
		}
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("signed flood: lab-eu sent %d signed messages for calls it never got, the hub dropped %.0f (the last %v after the first was sent, at --site-rate %d), %d trail events name them; 5 calls of lab-us and 5 of the hub meanwhile ended in %v",
		sent, dropped(), drained.Round(time.Millisecond), siteRate, trail, took.Round(time.Millisecond))
	// The hub's limiter holds a burst of a second's worth: the rest takes
	// at least (sent-rate)/rate seconds.
	if floor := time.Duration(float64(sent-siteRate) / siteRate * 0.85 * float64(time.Second)); drained < floor {
		t.Errorf("lab-eu's %d messages were through the hub in %v: faster than --site-rate %d allows (%v)", sent, drained, siteRate, floor)
	}
	if d := dropped(); d < float64(sent) {
		t.Errorf("the hub dropped %.0f of lab-eu's %d signed messages for calls not its own", d, sent)
	}
	if trail > 3 {
		t.Errorf("%d audit events for lab-eu's signed flood of %d messages, want a summary (at most a few)", trail, sent)
	}
	if took > 30*time.Second {
		t.Errorf("lab-us's and the hub's calls took %v during lab-eu's signed flood", took)
	}

	// 7. Sites are declared and removed by operators only, through the
	// control service: a stage's and control's own credentials and an
	// agent's token are refused by the bus (E3221); requests signed with
	// them on a connection that may reach the service are refused by it
	// (E3219) and audited; none declares or removes anything.
	for who, args := range map[string][]string{
		"verify":  {"--creds", node.CredsPath(hubData, busauth.RoleVerify)},
		"control": {"--creds", node.CredsPath(hubData, busauth.RoleControl)},
		"agent":   {"--token", tok},
	} {
		for _, cmd := range [][]string{{"site", "add", "rogue", "--out", filepath.Join(dir, "rogue-"+who)}, {"site", "remove", "lab-eu"}} {
			if out, err := tg(append(args, cmd...)...); err == nil || !strings.Contains(out, "E3221") {
				t.Errorf("%s with %s's credentials: %v %s, want E3221", cmd[1], who, err, out)
			}
		}
	}
	for _, role := range []busauth.Role{busauth.RoleVerify, busauth.RoleControl} {
		sg, err := busauth.SignerFromCreds(node.CredsPath(hubData, role))
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		c.Sign = func(subject string, body []byte) (nats.Header, error) { return sg.Sign(nil, subject, body, time.Now()) }
		k, err := busauth.NewSiteKeys()
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.AddSite(ctx, api.SiteRequest{Site: "rogue", UserKey: k.User(), SigningKey: k.Signing()})
		if !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.EAdminUnverified}) && !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.ERoleNotPermitted}) {
			t.Errorf("sites.add signed by %s: %v, want E3219 or E3245", role, err)
		}
		_, err = c.RemoveSite(ctx, "lab-eu", "")
		if !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.EAdminUnverified}) && !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.ERoleNotPermitted}) {
			t.Errorf("sites.remove signed by %s: %v, want E3219 or E3245", role, err)
		}
	}
	if !auditedAdmin(t, ctx, nc, "admin.site.added", `"target":"lab-us"`, `"by":"operator:`) {
		t.Error("no admin.site.added audit event naming the operator")
	}
	if l := siteList(); l["rogue"] != nil || l["lab-eu"] == nil {
		t.Errorf("site list after refused declarations and removals: %v", l)
	}
	if !auditedAdmin(t, ctx, nc, "admin.refused", "sites.add") || !auditedAdmin(t, ctx, nc, "admin.refused", "sites.remove") {
		t.Error("no admin.refused audit event for a refused site request")
	}
	// lab-us removed while its worker is linked: the link is cut and does
	// not come back (its credentials are refused when it dials again, and
	// the refusal audited), and a call for its tool ends at route.
	// Its process paused first, its link stays up while calls wait for it
	// (some delivered to its pulls, never settled): they end E3273 at its
	// removal, from the hub, and never run.
	sites["lab-us"].signal(syscall.SIGSTOP)
	var stranded []string
	for range 4 {
		stranded = append(stranded, invoke("us.append_file"))
	}
	time.Sleep(time.Second)
	for _, id := range stranded {
		if r, err := op.Status(ctx, tenant, id); err == nil && r.Status.Terminal() {
			t.Fatalf("%s for the paused lab-us: %v, want it waiting", id, r.Status)
		}
	}
	removed := time.Now()
	if out, err := tg("site", "remove", "lab-us"); err != nil || !strings.Contains(out, "1 of its links cut") {
		t.Fatalf("site remove lab-us: %v\n%s", err, out)
	}
	sites["lab-us"].signal(syscall.SIGCONT)
	endedCtx, endedCancel := context.WithTimeout(ctx, 30*time.Second)
	defer endedCancel()
	for _, id := range stranded {
		if r, err := op.Wait(endedCtx, tenant, id); err != nil || r.Error == nil || r.Error.ECode != api.ESiteRemoved {
			t.Errorf("%s, waiting for lab-us at its removal: %+v %v, want E3273; hub's log:\n%s", id, r.Error, err, grepLines(tailFile(hub.log, 200), "removed"))
		}
	}
	strandedEnded := time.Since(removed)
	// Its outbox and its consumers at the hub go with it.
	leftover := func() []string {
		var left []string
		if _, err := js.Stream(ctx, subjects.StreamSite("lab-us")); !errors.Is(err, jetstream.ErrStreamNotFound) {
			left = append(left, subjects.StreamSite("lab-us"))
		}
		for _, in := range subjects.SiteInputs("lab-us") {
			if _, err := js.Consumer(ctx, in.Stream, in.Consumer); !errors.Is(err, jetstream.ErrConsumerNotFound) {
				left = append(left, in.Consumer)
			}
		}
		return left
	}
	for deadline := time.Now().Add(20 * time.Second); len(leftover()) > 0 && time.Now().Before(deadline); {
		time.Sleep(250 * time.Millisecond)
	}
	if left := leftover(); len(left) > 0 {
		t.Errorf("the removed lab-us left %v at the hub", left)
	}
	if _, err := js.Stream(ctx, subjects.StreamSite("lab-eu")); err != nil {
		t.Errorf("lab-eu's outbox after lab-us's removal: %v", err)
	}
	if !auditedAdmin(t, ctx, nc, "admin.site.removed", `"target":"lab-us"`, `"by":"operator:`) {
		t.Error("no admin.site.removed audit event naming the operator")
	}
	if !auditedRefusal(t, ctx, nc, "not declared") {
		t.Error("lab-us's link dialled again after its removal and was not refused")
	}
	linked := func() bool {
		st, err := node.SiteStatus(ctx, js, "lab-us")
		return err != nil || st.Link == "up"
	}
	gone := time.Now().Add(20 * time.Second)
	for linked() && time.Now().Before(gone) {
		time.Sleep(250 * time.Millisecond)
	}
	for range 12 {
		if linked() {
			t.Fatal("lab-us's link is up after its removal")
		}
		time.Sleep(250 * time.Millisecond)
	}
	orphan := invoke("us.append_file")
	if r, err := op.Wait(ctx, tenant, orphan); err != nil || r.Error == nil || r.Error.ECode != api.ESiteRemoved {
		t.Errorf("a call for a removed site's tool: %+v %v, want E3273", r.Error, err)
	}
	for _, id := range append(stranded, orphan) {
		if n := ledgerCounts(t, roots["lab-us"])[id]; n != 0 {
			t.Errorf("%s, a call for the removed lab-us, ran there %d times", id, n)
		}
	}
	// Its process dials again every second, refused each time: the trail
	// records that once a minute, not once a dial.
	time.Sleep(3 * time.Second)
	redials := 0
	if err := readStream(ctx, js, subjects.StreamAudit, refusal, func(m jetstream.Msg) {
		if d := string(m.Data()); strings.Contains(d, "lab-us") && strings.Contains(d, "not declared") {
			redials++
		}
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("removed lab-us: its %d waiting calls ended E3273 in %v; %v after its removal, %d refusals of its link in the trail",
		len(stranded), strandedEnded.Round(time.Millisecond), time.Since(removed).Round(time.Second), redials)
	if redials != 1 {
		t.Errorf("%d refusals of the removed lab-us's link in the trail, want one (once a minute)", redials)
	}
}

// auditedAdmin reports whether the audit trail holds, within a few
// seconds, an event of _system of suffix whose data contains each of want.
func auditedAdmin(t *testing.T, ctx context.Context, nc *nats.Conn, suffix string, want ...string) bool {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		found := false
		err := readStream(ctx, js, subjects.StreamAudit, subjects.AuditEvent(subjects.SystemTenant, suffix), func(m jetstream.Msg) {
			all := true
			for _, w := range want {
				all = all && strings.Contains(string(m.Data()), w)
			}
			found = found || all
		})
		if err != nil {
			t.Fatal(err)
		}
		if found {
			return true
		}
		time.Sleep(500 * time.Millisecond)
	}
	return false
}

// scrape reads a process's /metrics.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// forgeAsSite connects to the hub as site does (a leaf node with its
// credentials, signing with its key from bundle) and hands verify a
// success, and audit a failure, of call id, which waits at the hub for
// another site: what a site holding execute's key could once do.
func forgeAsSite(t *testing.T, ctx context.Context, opnc *nats.Conn, leafPort int, bundle, site, id string) {
	t.Helper()
	_, raw, err := waitingSiteCall(ctx, opnc)
	if err != nil {
		t.Fatalf("no call waits for a site: %v", err)
	}
	real, err := envelope.Decode(raw.Data)
	if err != nil || real.ID != id {
		t.Fatalf("the waiting call: %v %v, want %s", real, err, id)
	}
	priority := strings.Split(raw.Subject, ".")[3]
	js := siteSigning(t, leafPort, bundle, site, "forger")

	success, _ := envelope.Decode(raw.Data)
	success.Succeed(subjects.Execute, json.RawMessage(`{"forged":true}`))
	failure, _ := envelope.Decode(raw.Data)
	failure.Fail(subjects.Execute, api.NewError(api.ToolExecutionError, api.EOutcomeUnknown, "forged"))
	for next, inv := range map[string]*envelope.Invocation{subjects.Verify: success, subjects.Audit: failure} {
		o, err := runner.Handoff(inv, next)
		if err != nil {
			t.Fatal(err)
		}
		o.Subject = subjects.Pipe(next, priority, tenant)
		// The leaf link comes up in the background: retry until it has.
		for {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err = runner.Publish(pctx, js, o)
			cancel()
			if err == nil || ctx.Err() != nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("%s's forged hand-off to %s: %v", site, next, err)
		}
	}
}

// siteConn connects to the hub as site's worker does: through a leaf
// server of its own named site-name, with the credentials of its bundle.
// done closes both.
func siteConn(t *testing.T, leafPort int, bundle, site, name string) (nc *nats.Conn, done func()) {
	t.Helper()
	creds := filepath.Join(bundle, busauth.DirName, busauth.SiteCredsFile)
	ns, err := node.StartSiteLeaf(node.SiteOptions{Hub: fmt.Sprintf("nats-leaf://127.0.0.1:%d", leafPort), Creds: creds, Name: site + "-" + name}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	nc, err = nats.Connect(ns.ClientURL(), nats.InProcessServer(ns), busauth.CredentialsOption(creds),
		nats.CustomInboxPrefix(subjects.SiteInbox(site)))
	if err != nil {
		ns.Shutdown()
		t.Fatal(err)
	}
	return nc, func() { nc.Close(); ns.Shutdown() }
}

// siteSigning connects to the hub as site does (a leaf node with its
// bundle's credentials) and returns a JetStream that signs with the site's
// key and sends through its outbox, as the site's worker does; it is
// closed with the test.
func siteSigning(t *testing.T, leafPort int, bundle, site, name string) jetstream.JetStream {
	t.Helper()
	nc, done := siteConn(t, leafPort, bundle, site, name)
	t.Cleanup(done)
	pubs, err := busauth.LoadHopPublicKeys(bundle)
	if err != nil {
		t.Fatal(err)
	}
	key, err := busauth.LoadHopKey(bundle, busauth.SiteRole(site))
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.NewWithDomain(nc, subjects.HubDomain)
	if err != nil {
		t.Fatal(err)
	}
	return seal.SigningJetStream(runner.Outboxing(js, site), seal.NewMessages(pubs).NewSigner(busauth.SiteRole(site), key))
}

// signedFloodAsSite sends, as site and signed with its key, n hand-offs
// to verify and endings to audit of calls it never got (ids
// signed-flood-N), each as fast as its outbox takes it. It returns how
// many the outbox took.
func signedFloodAsSite(t *testing.T, ctx context.Context, leafPort int, bundle, site string, n int) (sent int) {
	t.Helper()
	js := siteSigning(t, leafPort, bundle, site, "signed-flood")
	for i := range n {
		inv := &envelope.Invocation{ID: fmt.Sprintf("signed-flood-%04d", i), Tenant: tenant,
			Route: &envelope.Route{ToolID: "eu.append_file", Site: site}}
		next := subjects.Verify
		if i%2 == 0 {
			inv.Succeed(subjects.Execute, json.RawMessage(`{"forged":true}`))
		} else {
			inv.Fail(subjects.Execute, api.NewError(api.ToolExecutionError, api.EOutcomeUnknown, "forged"))
			next = subjects.Audit
		}
		o, err := runner.Handoff(inv, next)
		if err != nil {
			t.Fatal(err)
		}
		// The leaf link comes up in the background: the first waits for it.
		for {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err = runner.Publish(pctx, js, o)
			cancel()
			if err == nil || ctx.Err() != nil || sent > 0 {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err == nil {
			sent++
		}
	}
	if sent == 0 {
		t.Fatalf("%s's signed flood: nothing sent", site)
	}
	return sent
}

// metricValue is the value of series (name{labels} as /metrics writes
// it) in metrics, 0 when it is not there.
func metricValue(metrics, series string) float64 {
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}

// floodAsSite connects to the hub as site does and sends n unsigned
// messages on its outbox as fast as JetStream takes them: relay events and
// hand-offs to verify. It returns how many the outbox refused and how many
// it took.
func floodAsSite(t *testing.T, ctx context.Context, leafPort int, bundle, site string, n int) (refused, accepted int) {
	t.Helper()
	nc, done := siteConn(t, leafPort, bundle, site, "flood")
	defer done()
	js, err := jetstream.NewWithDomain(nc, subjects.HubDomain, jetstream.WithPublishAsyncMaxPending(512))
	if err != nil {
		t.Fatal(err)
	}
	js = runner.Outboxing(js, site)
	targets := []string{subjects.Relay(subjects.AuditEvent(tenant, "tool.invoked")), subjects.Pipe(subjects.Verify, "normal", tenant)}
	// The link comes up in the background: the first publish waits for it.
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := js.Publish(pctx, targets[0], []byte(`{"flood-junk":0}`))
		cancel()
		if err == nil {
			accepted++
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%s's flood link did not come up: %v", site, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var futures []jetstream.PubAckFuture
	for i := 1; i < n; i++ {
		f, err := js.PublishAsync(targets[i%2], []byte(fmt.Sprintf(`{"flood-junk":%d}`, i)))
		if err != nil {
			refused++
			continue
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
			accepted++
		case <-f.Err():
			refused++
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	return refused, accepted
}

// waitingSiteCall is the pipeline message of the latest call waiting for a
// site, and the pipeline, read with the operator's connection opnc.
func waitingSiteCall(ctx context.Context, opnc *nats.Conn) (jetstream.Stream, *jetstream.RawStreamMsg, error) {
	opjs, err := jetstream.New(opnc)
	if err != nil {
		return nil, nil, err
	}
	stream, err := opjs.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		return nil, nil, err
	}
	for _, p := range subjects.Priorities {
		raw, err := stream.GetLastMsgForSubject(ctx, subjects.Pipe(subjects.Execute, p, tenant)+".*")
		if err == nil {
			return stream, raw, nil
		}
	}
	return nil, nil, errors.New("none in any priority")
}

// sweepAsSite connects to the hub as site does and asks the hub's
// JetStream for the pipeline message of call id, which waits for another
// site, by its sequence, and to delete it: both must be refused, and the
// message stay.
func sweepAsSite(t *testing.T, ctx context.Context, opnc *nats.Conn, leafPort int, bundle, site, id string) {
	t.Helper()
	stream, raw, err := waitingSiteCall(ctx, opnc)
	if err != nil || !strings.Contains(string(raw.Data), id) {
		t.Fatalf("no pipeline message of %s: %v", id, err)
	}
	nc, done := siteConn(t, leafPort, bundle, site, "sweeper")
	defer done()
	// The link is up once the site's own consumer answers across it.
	js, err := jetstream.NewWithDomain(nc, subjects.HubDomain)
	if err != nil {
		t.Fatal(err)
	}
	own := subjects.SiteInputs(site)[0]
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := js.Consumer(pctx, own.Stream, own.Consumer)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%s's link did not come up: %v", site, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for what, req := range map[string]func(context.Context) error{
		"get": func(ctx context.Context) error {
			_, err := nc.RequestWithContext(ctx, "$JS."+subjects.HubDomain+".API.STREAM.MSG.GET."+subjects.StreamPipeline, []byte(fmt.Sprintf(`{"seq":%d}`, raw.Sequence)))
			return err
		},
		"delete": func(ctx context.Context) error {
			_, err := nc.RequestWithContext(ctx, "$JS."+subjects.HubDomain+".API.STREAM.MSG.DELETE."+subjects.StreamPipeline, []byte(fmt.Sprintf(`{"seq":%d,"no_erase":true}`, raw.Sequence)))
			return err
		},
		"direct get": func(ctx context.Context) error {
			_, err := nc.RequestWithContext(ctx, "$JS."+subjects.HubDomain+".API.DIRECT.GET."+subjects.StreamPipeline, []byte(fmt.Sprintf(`{"seq":%d}`, raw.Sequence)))
			return err
		},
	} {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := req(pctx)
		cancel()
		if err == nil {
			t.Errorf("%s's credentials: a %s of another site's call by its sequence was answered", site, what)
		}
	}
	if _, err := stream.GetMsg(ctx, raw.Sequence); err != nil {
		t.Errorf("%s's call is gone from the pipeline after %s's delete: %v", id, site, err)
	}
}

// auditedPoison reports whether the audit trail holds, within wait,
// seconds, a pipeline.poison event of code naming invocation id.
func auditedPoison(t *testing.T, ctx context.Context, nc *nats.Conn, id, code string, wait time.Duration) bool {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(wait); ; {
		found := false
		err := readStream(ctx, js, subjects.StreamAudit, subjects.AuditEvent(tenant, envelope.SubjectSuffix(api.TypePoison)), func(m jetstream.Msg) {
			if d := string(m.Data()); strings.Contains(d, code) && strings.Contains(d, id) {
				found = true
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if found {
			return true
		}
		if !time.Now().Before(deadline) {
			return false
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// rawLeafViolation connects to the hub's leaf port as a leaf node with a
// site's credentials, speaking the protocol itself, subscribes to a subject
// outside the site's grant and returns what the hub answers.
func rawLeafViolation(t *testing.T, leafPort int, creds string) string {
	t.Helper()
	b, err := os.ReadFile(creds)
	if err != nil {
		t.Fatal(err)
	}
	tok, seed, err := busauth.SplitCreds(b)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", leafPort), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "INFO ") {
		t.Fatalf("leaf INFO: %q %v", line, err)
	}
	var info struct {
		Nonce string `json:"nonce"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "INFO ")), &info); err != nil {
		t.Fatal(err)
	}
	sig, err := kp.Sign([]byte(info.Nonce))
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	connect, _ := json.Marshal(map[string]any{"nkey": pub, "sig": base64.RawURLEncoding.EncodeToString(sig),
		"user": string(tok), "auth_token": string(tok), "name": "raw-leaf", "headers": true})
	fmt.Fprintf(conn, "CONNECT %s\r\nPING\r\n", connect)
	for {
		line, err = r.ReadString('\n')
		if err != nil {
			t.Fatalf("leaf CONNECT: %v", err)
		}
		if strings.HasPrefix(line, "PONG") {
			break
		}
		if strings.HasPrefix(line, "-ERR") {
			t.Fatalf("leaf CONNECT refused: %q", line)
		}
	}
	fmt.Fprintf(conn, "LS+ %s\r\n", subjects.Pipe(subjects.Authorize, "normal", tenant))
	var got []string
	for {
		line, err = r.ReadString('\n')
		if err != nil {
			return strings.Join(got, "")
		}
		if strings.HasPrefix(line, "-ERR") {
			got = append(got, line)
		}
	}
}

// auditedRefusal reports whether the audit trail holds, within a few
// seconds, a bus.refused event whose data contains what.
func auditedRefusal(t *testing.T, ctx context.Context, nc *nats.Conn, what string) bool {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		found := false
		err := readStream(ctx, js, subjects.StreamAudit, subjects.AuditEvent(subjects.SystemTenant, "bus.refused"), func(m jetstream.Msg) {
			if strings.Contains(string(m.Data()), what) {
				found = true
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if found {
			return true
		}
		time.Sleep(500 * time.Millisecond)
	}
	return false
}
