package node_test

import (
	"context"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// grant is a token for tenant and the test agent granting tools.
func grant(tenant string, tools ...string) token.Claims {
	return token.Claims{ToolID: token.Patterns(tools), TenantID: tenant, AgentDID: "did:agent:test",
		Filesystem: &token.FilesystemGrant{AllowedPaths: []string{"/"}, Mode: "rw"}}
}

func withTok(req api.Request, raw string) api.Request {
	req.CapabilityToken = raw
	return req
}

// expectDenied checks an invocation ended with ecode and its one terminal
// permission_denied (or failed) audit event.
func expectDenied(t *testing.T, resp api.Response, status api.Status, ecode string) {
	t.Helper()
	if resp.Status != status || resp.Error == nil || resp.Error.ECode != ecode {
		t.Fatalf("got %s %s, want %s %s", resp.Status, mustJSON(t, resp.Error), status, ecode)
	}
}

var riskyTools = []string{
	`{"id":"test.high","name":"high","version":"1.0.0","description":"high risk","kind":"builtin","builtin":{"function":"echo"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "safety":{"risk_level":"high","side_effects":["payments.charge"],"reversible":false}}`,
	`{"id":"test.critical","name":"critical","version":"1.0.0","description":"critical risk","kind":"builtin","builtin":{"function":"echo"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},"safety":{"risk_level":"critical"}}`,
	`{"id":"test.costly","name":"costly","version":"1.0.0","description":"costs","kind":"builtin","builtin":{"function":"noop"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},"cost":{"per_call":0.25}}`,
}

func registerTools(t *testing.T, n *node.Node, docs ...string) {
	t.Helper()
	ctx := context.Background()
	for _, doc := range docs {
		m, err := n.Store.RegisterTool(ctx, []byte(doc), true)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.WaitForTool(ctx, m.ID, m.Version); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTokenAttacks: every forged, stale or misdirected token is refused at
// authorize with its code and an audit event, and nothing runs.
func TestTokenAttacks(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{})
	const tenant = "tok"
	req := request(tenant, "echo", `{"message":"x"}`)
	good := mint(t, grant(tenant, "echo"))

	// alg none and the HS256 key-confusion forgery, under the real kid.
	none := jwt.NewWithClaims(jwt.SigningMethodNone, claimsFor(grant(tenant, "*")))
	none.Header["kid"] = testKey().KID
	noneRaw, _ := none.SignedString(jwt.UnsafeAllowNoneSignatureType)
	rsaKey, _ := token.GenerateSigningKey(token.AlgRS256)
	der, _ := x509.MarshalPKIXPublicKey(rsaKey.Key.Public().(*rsa.PublicKey))
	hs := jwt.NewWithClaims(jwt.SigningMethodHS256, claimsFor(grant(tenant, "*")))
	hs.Header["kid"] = testKey().KID
	hsRaw, _ := hs.SignedString(der)
	// A token from a key nobody configured.
	strangerRaw, _ := token.Mint(rsaKey, claimsFor(grant(tenant, "*")))
	// The good token with its tenant rewritten.
	parts := strings.Split(good, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	parts[1] = base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(payload), `"tok"`, `"tak"`, 1)))
	tampered := strings.Join(parts, ".")

	expired := grant(tenant, "echo")
	expired.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-time.Minute))
	early := grant(tenant, "echo")
	early.NotBefore = jwt.NewNumericDate(time.Now().Add(time.Hour))
	ranged := grant(tenant, "echo")
	ranged.ToolVersion = "^1" // echo's latest is 2.0.0

	cases := []struct {
		name, raw string
		ecode     string
	}{
		{"no token", "", api.ETokenInvalid},
		{"alg none", noneRaw, api.ETokenInvalid},
		{"HS256 keyed with an RSA public key", hsRaw, api.ETokenInvalid},
		{"unknown kid", strangerRaw, api.ETokenInvalid},
		{"tampered payload", tampered, api.ETokenInvalid},
		{"expired", mint(t, expired), api.ETokenExpired},
		{"not yet valid", mint(t, early), api.ETokenInvalid},
		{"another tenant", mint(t, grant("other", "*")), api.ENotGranted},
		{"another tool", mint(t, grant(tenant, "sleep", "fs.*")), api.ENotGranted},
		{"version outside the range", mint(t, ranged), api.ENotGranted},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.t = t
			expectDenied(t, e.invoke(withTok(req, c.raw)), api.StatusPermissionDenied, c.ecode)
		})
	}
	e.t = t
	if got := e.count(subjects.StreamAudit, subjects.AuditEvent(tenant, envelope.SubjectSuffix(api.TypePermissionDenied))); got != len(cases) {
		t.Fatalf("%d permission_denied audit events, want %d", got, len(cases))
	}
	// The version the range allows works with the same token.
	ok := withTok(req, mint(t, ranged))
	ok.ToolVersion = "1.0.0"
	if resp := e.invoke(ok); resp.Status != api.StatusSuccess {
		t.Fatalf("in-range version: %+v", resp)
	}

	// Revocation reaches every worker within a second, and revokes the
	// tokens derived from the revoked one.
	parent := grant(tenant, "*")
	parent.ID = "parent-1"
	parentRaw := mint(t, parent)
	parentClaims, err := testVerifier().Verify(parentRaw)
	if err != nil {
		t.Fatal(err)
	}
	child, err := token.Attenuate(parentClaims, token.Claims{ToolID: token.Patterns{"echo"}})
	if err != nil {
		t.Fatal(err)
	}
	childRaw := mint(t, child)
	if resp := e.invoke(withTok(req, childRaw)); resp.Status != api.StatusSuccess {
		t.Fatalf("child token before revocation: %+v", resp)
	}
	if resp := e.invoke(withTok(request(tenant, "noop", `{}`), childRaw)); resp.Error == nil || resp.Error.ECode != api.ENotGranted {
		t.Fatalf("child token used beyond its tools: %+v", resp)
	}
	revokedAt := time.Now()
	if err := n.Store.Revoke(context.Background(), "parent-1", time.Now().Add(time.Hour), "test", "test", nil); err != nil {
		t.Fatal(err)
	}
	// The watch delivers in milliseconds; the generous bound only keeps a
	// loaded machine from failing the test. The figure is logged.
	eventually(t, 10*time.Second, "the revocation to reach the worker", func() bool {
		_, revoked := n.Revoked.Revoked(parentClaims)
		return revoked
	})
	t.Logf("revocation visible after %v", time.Since(revokedAt))
	expectDenied(t, e.invoke(withTok(req, parentRaw)), api.StatusPermissionDenied, api.ETokenRevoked)
	expectDenied(t, e.invoke(withTok(req, childRaw)), api.StatusPermissionDenied, api.ETokenRevoked)
}

func claimsFor(c token.Claims) token.Claims {
	c.Issuer, c.Audience = testIssuer, jwt.ClaimStrings{testAudience}
	c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(time.Hour))
	c.ID = "forged"
	return c
}

// TestResourceGrantsAndSideEffects: paths the call needs must lie within the
// token's grant (whole components), and excluded side effects are refused.
func TestResourceGrantsAndSideEffects(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	root := t.TempDir()
	for _, f := range []string{"docs/a.txt", "docs_evil/b.txt", "secret.txt"} {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("content of "+f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e.startPipeline(node.Config{Stage: node.StageConfig{Builtins: e.builtins(root)}})
	const tenant = "res"
	c := grant(tenant, "fs.*")
	c.Filesystem = &token.FilesystemGrant{AllowedPaths: []string{"/docs"}}
	raw := mint(t, c)
	read := func(p string) api.Response {
		return e.invoke(withTok(request(tenant, "fs.read_file", `{"path":"`+p+`"}`), raw))
	}
	if resp := read("docs/a.txt"); resp.Status != api.StatusSuccess || !strings.Contains(string(resp.Result), "content of docs/a.txt") {
		t.Fatalf("granted path: %+v %s", resp, resp.Result)
	}
	expectDenied(t, read("secret.txt"), api.StatusPermissionDenied, api.EFilesystemDenied)
	expectDenied(t, read("docs_evil/b.txt"), api.StatusPermissionDenied, api.EFilesystemDenied)

	noReads := grant(tenant, "*")
	noReads.ExcludedSideEffects = []string{"fs"}
	expectDenied(t, e.invoke(withTok(request(tenant, "fs.read_file", `{"path":"docs/a.txt"}`), mint(t, noReads))),
		api.StatusPermissionDenied, api.EPolicyDenied)
}

// TestApprovalFlow: a high-risk call parks without holding a worker, a flood
// of approvals sent to two control services resumes it exactly once, a
// denial ends a call, an unknown or decided one is refused, and a
// pre-approval lets high risk (not critical) through.
func TestApprovalFlow(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{Workers: 1})
	// A second process with authorize and control: decisions may land on either.
	e.startPipeline(node.Config{Stages: []string{subjects.Authorize, node.Control}, Workers: 1})
	registerTools(t, n, riskyTools...)
	const tenant = "appr"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	park := func(tool string, raw string) string {
		t.Helper()
		id, err := e.client.Invoke(ctx, withTok(request(tenant, tool, `{"amount":12,"card":"4111 1111 1111 1111"}`), raw), clientOpts(""))
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the call to park", func() bool {
			rec, err := e.client.Status(ctx, tenant, id)
			return err == nil && rec.Status == api.StatusPendingApproval
		})
		return id
	}
	raw := mint(t, grant(tenant, "*"))
	id := park("test.high", raw)
	// The approval-requested event names the risk and carries redacted parameters.
	ev := e.auditOf(tenant, 1)[0] // nothing ran: no tool.invoked before it
	var asked struct {
		envelope.AuditRecord
		Reasons    []string `json:"reasons"`
		RiskLevel  string   `json:"risk_level"`
		Reversible bool     `json:"reversible"`
	}
	if ev.Type() != api.TypeApprovalRequested || ev.DataAs(&asked) != nil || asked.RiskLevel != "high" ||
		len(asked.Reasons) == 0 || strings.Contains(string(asked.Parameters), "4111") {
		t.Fatalf("approval request event %s: %s", ev.Type(), ev.Data())
	}

	// Twenty concurrent approvals: one wins, the rest are told it was decided.
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins, decided := 0, 0
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.client.Decide(ctx, api.ApprovalDecision{Tenant: tenant, InvocationID: id, Approve: true,
				DecidedBy: "ops-" + string(rune('a'+i))})
			mu.Lock()
			defer mu.Unlock()
			var te *api.Error
			switch {
			case err == nil:
				wins++
			case errors.As(err, &te) && te.ECode == api.EApprovalDecided:
				decided++
			default:
				t.Errorf("decision: %v", err)
			}
		}()
	}
	wg.Wait()
	if wins != 1 || decided != 19 {
		t.Fatalf("%d decisions won, %d refused; want 1 and 19", wins, decided)
	}
	resp, err := e.client.Wait(ctx, tenant, id)
	if err != nil || resp.Status != api.StatusSuccess {
		t.Fatalf("approved call: %+v, %v", resp, err)
	}
	time.Sleep(300 * time.Millisecond) // let any duplicate surface
	for typ, want := range map[string]int{api.TypeApprovalGranted: 1, api.TypeSucceeded: 1} {
		if got := e.count(subjects.StreamAudit, subjects.AuditEvent(tenant, envelope.SubjectSuffix(typ))); got != want {
			t.Fatalf("%d %s events, want %d", got, typ, want)
		}
	}
	if got := e.count(subjects.StreamResults, subjects.ResultAnyAgent(tenant, id)); got != 1 {
		t.Fatalf("%d results, want 1", got)
	}

	// A denial ends the call, naming who denied it; a later approval is refused.
	id2 := park("test.high", raw)
	if _, err := e.client.Decide(ctx, api.ApprovalDecision{Tenant: tenant, InvocationID: id2, DecidedBy: "alice", Reason: "not today"}); err != nil {
		t.Fatal(err)
	}
	resp, err = e.client.Wait(ctx, tenant, id2)
	if err != nil {
		t.Fatal(err)
	}
	expectDenied(t, resp, api.StatusPermissionDenied, api.EApprovalDenied)
	if !strings.Contains(resp.Error.Message, "alice") {
		t.Fatalf("denial does not say who: %s", resp.Error.Message)
	}
	_, err = e.client.Decide(ctx, api.ApprovalDecision{Tenant: tenant, InvocationID: id2, Approve: true, DecidedBy: "bob"})
	wantECode(t, err, api.EApprovalDecided)
	_, err = e.client.Decide(ctx, api.ApprovalDecision{Tenant: tenant, InvocationID: "no-such-call", Approve: true, DecidedBy: "bob"})
	wantECode(t, err, api.EApprovalUnknown)

	// Pre-approval covers high risk, never critical.
	pre := grant(tenant, "*")
	pre.PreApproved = token.Patterns{"test.*"}
	preRaw := mint(t, pre)
	if resp := e.invoke(withTok(request(tenant, "test.high", `{}`), preRaw)); resp.Status != api.StatusSuccess {
		t.Fatalf("pre-approved high risk: %+v", resp)
	}
	park("test.critical", preRaw)
}

func wantECode(t *testing.T, err error, ecode string) {
	t.Helper()
	var te *api.Error
	if !errors.As(err, &te) || te.ECode != ecode {
		t.Fatalf("got %v, want %s", err, ecode)
	}
}

// TestApprovalDeadline: a pending approval past its deadline ends denied.
func TestApprovalDeadline(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{ApprovalSweep: 100 * time.Millisecond,
		Stage: node.StageConfig{ApprovalTimeout: 500 * time.Millisecond}})
	registerTools(t, n, riskyTools...)
	resp := e.invoke(withTok(request("late", "test.critical", `{}`), mint(t, grant("late", "*"))))
	expectDenied(t, resp, api.StatusPermissionDenied, api.EApprovalExpired)
	if got := e.count(subjects.StreamAudit, subjects.AuditEvent("late", envelope.SubjectSuffix(api.TypeApprovalExpired))); got != 1 {
		t.Fatalf("%d expiry events", got)
	}
}

// TestPolicyHotReload: a pushed policy reaches every worker without restart;
// one that does not compile is refused before it is stored.
func TestPolicyHotReload(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{})
	ctx := context.Background()
	const tenant = "pol"
	if resp := e.invoke(request(tenant, "noop", `{}`)); resp.Status != api.StatusSuccess {
		t.Fatalf("before push: %+v", resp)
	}
	dir := t.TempDir()
	strict := policy.DefaultModule() + "\ndeny contains {\"code\": \"E3209\", \"msg\": \"noop is switched off\"} if input.tool.id == \"noop\"\n"
	if err := os.WriteFile(filepath.Join(dir, "authz.rego"), []byte(strict), 0o644); err != nil {
		t.Fatal(err)
	}
	push := func(dir string) error {
		modules, data, err := policy.ReadDir(dir)
		if err != nil {
			return err
		}
		if _, err := policy.New(ctx, modules, data); err != nil {
			return err
		}
		_, err = n.Store.PushPolicy(ctx, kvstore.PolicyBundle{Modules: modules, Data: data, PushedBy: "test"})
		return err
	}
	if err := push(dir); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the pushed policy to deny noop", func() bool {
		resp := e.invoke(request(tenant, "noop", `{}`))
		return resp.Error != nil && resp.Error.ECode == api.EPolicyDenied && strings.Contains(resp.Error.Message, "switched off")
	})
	if resp := e.invoke(request(tenant, "echo", `{"message":"x"}`)); resp.Status != api.StatusSuccess {
		t.Fatalf("other tools under the pushed policy: %+v", resp)
	}

	// A syntax error is refused at push and the stored policy is unchanged.
	before, _, _ := n.Store.Policy(ctx)
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "authz.rego"), []byte("package toolgate.authz\ndecision := {\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := push(bad)
	wantECode(t, err, api.EPolicyFailed)
	after, _, _ := n.Store.Policy(ctx)
	if after.Revision != before.Revision {
		t.Fatal("a policy that does not compile was stored")
	}
}

// TestSessionBudget: concurrent calls of one session across workers never
// pass max_calls, cost is charged per call, and failures in a row require
// approval.
func TestSessionBudget(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{Workers: 3})
	e.startPipeline(node.Config{Stages: []string{subjects.Authorize}, Workers: 3})
	registerTools(t, n, riskyTools...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const tenant = "bud"

	c := grant(tenant, "*")
	c.SessionID = "s1"
	c.Budget = &token.Budget{MaxCalls: 5}
	raw := mint(t, c)
	req := withTok(request(tenant, "noop", `{}`), raw)
	req.AgentContext.SessionID = "s1"
	const total = 20
	ids := make([]string, total)
	for i := range ids {
		id, err := e.client.Invoke(ctx, req, clientOpts(""))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	ok, exhausted := 0, 0
	for _, id := range ids {
		resp, err := e.client.Wait(ctx, tenant, id)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case resp.Status == api.StatusSuccess:
			ok++
		case resp.Error != nil && resp.Error.Code == api.ResourceExhausted && resp.Error.ECode == api.EBudgetExhausted:
			exhausted++
		default:
			t.Fatalf("unexpected %+v", resp)
		}
	}
	if ok != 5 || exhausted != total-5 {
		t.Fatalf("%d succeeded and %d were refused; want 5 and %d", ok, exhausted, total-5)
	}
	vc, err := testVerifier().Verify(raw)
	if err != nil {
		t.Fatal(err)
	}
	u, err := n.Store.Usage(ctx, tenant, token.BudgetKey(vc.ID))
	if err != nil || u.Calls != 5 {
		t.Fatalf("usage %+v, %v", u, err)
	}

	// Cost: 0.25 a call against 0.6 admits two calls.
	cc := grant(tenant, "*")
	cc.SessionID = "s2"
	cc.Budget = &token.Budget{MaxCost: 0.6}
	costly := withTok(request(tenant, "test.costly", `{}`), mint(t, cc))
	costly.AgentContext.SessionID = "s2"
	for i, want := range []api.Status{api.StatusSuccess, api.StatusSuccess, api.StatusError} {
		if resp := e.invoke(costly); resp.Status != want {
			t.Fatalf("costly call %d: %+v", i, resp)
		}
	}

	// Two failures in a row: the third call waits for a human.
	fc := grant(tenant, "*")
	fc.SessionID = "s3"
	fc.Budget = &token.Budget{ApprovalAfterFailures: 2}
	fraw := mint(t, fc)
	boom := withTok(request(tenant, "test.boom", `{}`), fraw)
	boom.AgentContext.SessionID = "s3"
	for range 2 {
		if resp := e.invoke(boom); resp.Status != api.StatusError {
			t.Fatalf("boom: %+v", resp)
		}
	}
	next := withTok(request(tenant, "noop", `{}`), fraw)
	next.AgentContext.SessionID = "s3"
	id, err := e.client.Invoke(ctx, next, clientOpts(""))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the call after two failures to wait for approval", func() bool {
		rec, err := e.client.Status(ctx, tenant, id)
		return err == nil && rec.Status == api.StatusPendingApproval
	})

}

// TestBudgetBelongsToTokenTree: a budget is the token tree's, keyed by its
// root token, so naming new sessions or delegating to a child token buys no
// calls: six concurrent calls under max_calls=2, across three session ids
// and a child bound to a fourth, admit exactly two. A child's own tighter
// budget caps it as well.
func TestBudgetBelongsToTokenTree(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{Workers: 3})
	e.startPipeline(node.Config{Stages: []string{subjects.Authorize}, Workers: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const tenant = "tree"

	rc := grant(tenant, "*")
	rc.Budget = &token.Budget{MaxCalls: 2}
	rootRaw := mint(t, rc)
	root, err := testVerifier().Verify(rootRaw)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := token.Attenuate(root, token.Claims{SessionID: "child-session"})
	if err != nil {
		t.Fatal(err)
	}
	childRaw := mint(t, cc)

	var reqs []api.Request
	for _, s := range []string{"s-a", "s-b", "s-c", "s-a"} {
		r := withTok(request(tenant, "noop", `{}`), rootRaw)
		r.AgentContext.SessionID = s
		reqs = append(reqs, r)
	}
	for range 2 {
		r := withTok(request(tenant, "noop", `{}`), childRaw)
		r.AgentContext.SessionID = "child-session"
		reqs = append(reqs, r)
	}
	ids := make([]string, len(reqs))
	for i, r := range reqs {
		if ids[i], err = e.client.Invoke(ctx, r, clientOpts("")); err != nil {
			t.Fatal(err)
		}
	}
	ok, refused := 0, 0
	for _, id := range ids {
		resp, err := e.client.Wait(ctx, tenant, id)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case resp.Status == api.StatusSuccess:
			ok++
		case resp.Error != nil && resp.Error.Code == api.ResourceExhausted && resp.Error.ECode == api.EBudgetExhausted:
			refused++
		default:
			t.Fatalf("unexpected %s", mustJSON(t, resp))
		}
	}
	if ok != 2 || refused != 4 {
		t.Fatalf("%d succeeded and %d were refused; want 2 and 4", ok, refused)
	}
	if u, err := n.Store.Usage(ctx, tenant, token.BudgetKey(root.ID)); err != nil || u.Calls != 2 {
		t.Fatalf("tree usage %+v, %v", u, err)
	}
	for _, s := range []string{"s-a", "s-b", "s-c", "child-session"} {
		if u, err := n.Store.Usage(ctx, tenant, s); err != nil || u.Calls != 0 {
			t.Fatalf("usage under session %s: %+v, %v", s, u, err)
		}
	}

	// A child limited to one call, of a root with ten: the child gets one,
	// the root keeps calling.
	big := grant(tenant, "*")
	big.Budget = &token.Budget{MaxCalls: 10}
	bigRaw := mint(t, big)
	bigRoot, err := testVerifier().Verify(bigRaw)
	if err != nil {
		t.Fatal(err)
	}
	small, err := token.Attenuate(bigRoot, token.Claims{Budget: &token.Budget{MaxCalls: 1}})
	if err != nil {
		t.Fatal(err)
	}
	smallRaw := mint(t, small)
	for i, want := range []api.Status{api.StatusSuccess, api.StatusError} {
		if resp := e.invoke(withTok(request(tenant, "noop", `{}`), smallRaw)); resp.Status != want {
			t.Fatalf("child call %d: %s", i, mustJSON(t, resp))
		}
	}
	if resp := e.invoke(withTok(request(tenant, "noop", `{}`), bigRaw)); resp.Status != api.StatusSuccess {
		t.Fatalf("root call after its child's: %s", mustJSON(t, resp))
	}
	if u, err := n.Store.Usage(ctx, tenant, token.BudgetKey(bigRoot.ID)); err != nil || u.Calls != 2 {
		t.Fatalf("tree usage %+v, %v", u, err)
	}
}
