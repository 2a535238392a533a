package busauth

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	gjwt "github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/subjects"
	// The capability token package; it moves to internal/token in the
	// reorganisation. Only this test adapter imports it.
)

// tokenAdapter verifies connect tokens with the authorize stage's verifier
// and revocation set, mapping its errors to the callout's reasons.
type tokenAdapter struct {
	v   *token.Verifier
	rev *token.Revocations
}

func (a tokenAdapter) VerifyConnectToken(_ context.Context, raw string) (AgentToken, error) {
	c, err := a.v.Verify(raw)
	if err != nil {
		switch {
		case errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.ETokenExpired}):
			return AgentToken{}, errors.Join(ErrExpired, err)
		case errors.Is(err, gjwt.ErrTokenSignatureInvalid), errors.Is(err, gjwt.ErrTokenUnverifiable):
			return AgentToken{}, errors.Join(ErrBadSignature, err)
		}
		return AgentToken{}, errors.Join(ErrBadToken, err)
	}
	at := AgentToken{Tenant: c.TenantID, Subject: c.AgentDID, ID: c.ID, Chain: c.Chain, Expires: c.ExpiresAt.Time, TenantReader: c.TenantReader}
	if id, revoked := a.rev.Revoked(c); revoked {
		return at, errors.Join(ErrRevoked, errors.New("token "+id+" is revoked"))
	}
	return at, nil
}

type recAuditor struct {
	mu sync.Mutex
	rs []Refusal
}

func (a *recAuditor) Refused(_ context.Context, r Refusal) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rs = append(a.rs, r)
}

func (a *recAuditor) last() Refusal {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.rs) == 0 {
		return Refusal{}
	}
	return a.rs[len(a.rs)-1]
}

type bus struct {
	srv     *server.Server
	dir     string
	keys    *Keys
	callout *Callout
	audit   *recAuditor
	signer  *token.SigningKey
	rev     *token.Revocations
}

const (
	testIssuer   = "https://toolgate.test"
	testAudience = "toolgate"
)

// forEachAuth runs test against both ways the bus authenticates: the auth
// callout (external servers, clusters) and in-process (the embedded
// server). One mapping serves both, so every table holds for each.
func forEachAuth(t *testing.T, test func(*testing.T, *bus)) {
	for _, inProcess := range []bool{false, true} {
		name := "callout"
		if inProcess {
			name = "in-process"
		}
		t.Run(name, func(t *testing.T) { test(t, startBus(t, inProcess)) })
	}
}

// startBus runs an embedded server on a random port and a temporary store,
// its clients authenticated by the callout or in-process, and creates
// toolgate's streams as the operator.
func startBus(t *testing.T, inProcess bool) *bus {
	t.Helper()
	b := &bus{dir: t.TempDir(), audit: &recAuditor{}, rev: new(token.Revocations)}
	var err error
	if b.keys, err = WriteCredentials(b.dir); err != nil {
		t.Fatal(err)
	}
	if b.signer, err = token.GenerateSigningKey(token.AlgEdDSA); err != nil {
		t.Fatal(err)
	}
	jwks, _ := b.signer.PublicJWKS()
	ks, err := token.ParseKeySet(jwks)
	if err != nil {
		t.Fatal(err)
	}
	cfg := CalloutConfig{
		Keys:     b.keys,
		Verifier: tokenAdapter{v: &token.Verifier{Keys: token.StaticKeys{Set: ks}, Issuer: testIssuer, Audience: testAudience}, rev: b.rev},
		Auditor:  b.audit,
		Tenants:  func(t string) bool { return t == "demo" || t == "other" },
	}
	// Through the callout the server holds the declared tenants' accounts;
	// in-process, each is made when its first agent connects.
	st := ServerSettings{Name: "test", Port: -1, StoreDir: filepath.Join(b.dir, "js")}
	if !inProcess {
		st.Tenants = []string{"demo", "other"}
	}
	if inProcess {
		if st.InProcess, err = NewInProcess(cfg); err != nil {
			t.Fatal(err)
		}
		b.callout = st.InProcess.Callout()
	}
	opts, err := EmbeddedOptions(b.keys, st)
	if err != nil {
		t.Fatal(err)
	}
	if b.srv, err = server.NewServer(opts); err != nil {
		t.Fatal(err)
	}
	if inProcess {
		st.InProcess.Bind(b.srv)
	}
	b.srv.Start()
	t.Cleanup(b.srv.Shutdown)
	if !b.srv.ReadyForConnections(5 * time.Second) {
		t.Fatal("server not ready")
	}
	if !inProcess {
		sys := b.connect(t, b.keys.SystemConnectOption())
		cfg.Kicker = SystemKicker{NC: sys}
		if b.callout, err = NewCallout(cfg); err != nil {
			t.Fatal(err)
		}
		cnc := b.connect(t, b.keys.CalloutConnectOption())
		if _, err := b.callout.Start(cnc); err != nil {
			t.Fatal(err)
		}
		if err := cnc.Flush(); err != nil {
			t.Fatal(err)
		}
	}

	op := b.connect(t, CredentialsOption(filepath.Join(b.dir, DirName, OperatorCredsFile)))
	js, _ := jetstream.New(op)
	ctx := context.Background()
	for _, cfg := range []jetstream.StreamConfig{
		{Name: subjects.StreamInvoke, Subjects: []string{subjects.InvokeAll}},
		{Name: subjects.StreamPipeline, Subjects: []string{subjects.PipeAll}},
		{Name: subjects.StreamResults, Subjects: []string{subjects.ResultAll}, AllowDirect: true},
		{Name: subjects.StreamAudit, Subjects: []string{subjects.AuditAll}, DenyDelete: true, DenyPurge: true},
	} {
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: subjects.BucketRevocations}); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *bus) dial(opts ...nats.Option) (*nats.Conn, error) {
	return nats.Connect(b.srv.ClientURL(), append([]nats.Option{nats.NoReconnect(), nats.Timeout(3 * time.Second)}, opts...)...)
}

func (b *bus) connect(t *testing.T, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := b.dial(opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func (b *bus) creds(role Role) nats.Option {
	return CredentialsOption(filepath.Join(b.dir, DirName, CredsFile(role)))
}

// mint returns a capability token for tenant; change edits the claims.
func (b *bus) mint(t *testing.T, tenant string, change func(*token.Claims)) (string, *token.Claims) {
	t.Helper()
	c := token.Claims{ToolID: token.Patterns{"*"}, AgentDID: "did:example:agent", TenantID: tenant}
	c.Issuer = testIssuer
	c.Audience = gjwt.ClaimStrings{testAudience}
	c.ID = "tok-" + tenant + "-" + nkeyish()
	c.ExpiresAt = gjwt.NewNumericDate(time.Now().Add(time.Hour))
	c.IssuedAt = gjwt.NewNumericDate(time.Now().Add(-time.Minute))
	if change != nil {
		change(&c)
	}
	raw, err := token.Mint(b.signer, c)
	if err != nil {
		t.Fatal(err)
	}
	return raw, &c
}

func nkeyish() string {
	kp, _ := nkeys.CreateUser()
	p, _ := kp.PublicKey()
	return strings.ToLower(p[1:9])
}

// agent connects with a token of tenant, using its private inbox prefix.
func (b *bus) agent(t *testing.T, tenant string) (*nats.Conn, *token.Claims) {
	t.Helper()
	raw, c := b.mint(t, tenant, nil)
	return b.connect(t, nats.Token(raw), nats.CustomInboxPrefix(InboxPrefix(tenant, c.ID))), c
}

// denied runs op on nc and reports whether the server refused it with a
// permissions violation naming subject.
func denied(t *testing.T, nc *nats.Conn, subject string) bool {
	t.Helper()
	if err := nc.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	err := nc.LastError()
	return errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), subject)
}

func TestBusRoles(t *testing.T) { forEachAuth(t, testBusRoles) }

func testBusRoles(t *testing.T, b *bus) {
	type op struct {
		sub     bool
		subject string
		allowed bool
	}
	roles := []struct {
		name string
		dial func(t *testing.T) *nats.Conn
		ops  []op
	}{
		{"agent", func(t *testing.T) *nats.Conn { nc, _ := b.agent(t, "demo"); return nc }, []op{
			{false, "tool.invoke.demo", true},
			{false, "tool.svc.demo.status", true},
			{false, "tool.svc.demo.cancel", true},
			{false, "tool.svc.demo.capability.request", true},
			{false, "tool.svc.demo.capability.report", true},
			{false, "tool.svc.other.capability.request", false},
			{false, "tool.svc.tools.stats", false},
			{false, "tool.invoke.other", false},
			{false, "toolgate.pipe.validate.normal.demo", false},
			{false, "toolgate.pipe.execute.high.demo", false},
			{false, "tool.svc.approval", false},
			{false, "tool.svc.other.cancel", false},
			{false, "tool.result.demo.forged", false},
			{false, "audit.demo.tool.succeeded", false},
			{false, "$JS.API.STREAM.DELETE.AUDIT", false},
			{false, "$JS.API.STREAM.PURGE.KV_toolgate_revocations", false},
			{false, "$KV.toolgate_revocations.tok", false},
			{false, "$JS.API.CONSUMER.CREATE.AUDIT", false},
			{true, subjects.ResultAgent("demo", "did:example:agent"), true},
			{true, subjects.ResultAgent("demo", "did:example:other"), false},
			{true, "tool.result.demo.>", false}, // a tenant reader's
			{true, "audit.demo.>", false},       // a tenant reader's
			{true, "tool.result.other.>", false},
			{true, "audit.other.>", false},
			{true, "audit.>", false},
			{true, "_INBOX.>", false},
			{true, "toolgate.pipe.>", false},
		}},
		{"execute", func(t *testing.T) *nats.Conn { return b.connect(t, b.creds(RoleExecute)) }, []op{
			{false, "toolgate.pipe.verify.normal.demo", true},
			{false, "toolgate.pipe.execute.normal.demo", false},
			{false, "tool.result.demo.x", false},
			{false, "audit.demo.tool.succeeded", false},
			{false, "audit.demo.tool.invoked", false},
			{false, "toolgate.relay.audit.demo.tool.invoked", true},
			{false, "toolgate.relay.audit.demo.tool.succeeded", false},
			{false, "toolgate.relay.tool.result.demo.x", false},
			{false, "$KV.toolgate_invocations.x", true},
			{false, "$JS.API.STREAM.DELETE.AUDIT", false},
			{false, "$JS.API.STREAM.PURGE.AUDIT", false},
			{false, "$JS.API.STREAM.UPDATE.AUDIT", false},
			{false, "$KV.toolgate_revocations.tok", false},
			{false, "$KV.toolgate_policies.p", false},
			{false, "$KV.toolgate_tools.echo", false},
			{false, "tool.svc.approval", false},
			{false, "tool.svc.tools.register", false},
			{false, "tool.svc.policy.push", false},
			{false, "tool.svc.hooks.push", false},
			{false, "tool.svc.tokens.revoke", false},
			{false, "tool.svc.breakers.set", false},
			{false, "tool.svc.models.register", false},
			{true, "toolgate.pipe.>", false},
			{true, "_INBOX.>", false},
			{true, "_INBOX.execute.x", true},
			{true, "tool.svc.approval", false},
		}},
		{"control", func(t *testing.T) *nats.Conn { return b.connect(t, b.creds(RoleControl)) }, []op{
			{false, "toolgate.pipe.authorize.normal.demo", true},
			{false, "toolgate.pipe.execute.normal.demo", false},
			{false, "$KV.toolgate_tools.echo", true},
			{false, "$KV.toolgate_policies.p", true},
			{false, "$KV.toolgate_revocations.tok", true},
			{false, "$KV.toolgate_budgets.demo.s", false},
			{false, "$JS.API.STREAM.DELETE.AUDIT", false},
			{true, "tool.svc.approval", true},
			{true, "toolgate.pipe.>", false},
		}},
		{"operator", func(t *testing.T) *nats.Conn { return b.connect(t, b.creds(RoleOperator)) }, []op{
			{false, "tool.svc.approval", true},
			{false, "tool.svc.policy.push", true},
			{false, "tool.svc.tokens.revoke", true},
			{false, "$KV.toolgate_revocations.tok", true},
			{true, ">", true},
		}},
	}
	for _, r := range roles {
		t.Run(r.name, func(t *testing.T) {
			for _, o := range r.ops {
				nc := r.dial(t)
				if o.sub {
					if _, err := nc.SubscribeSync(o.subject); err != nil {
						t.Fatal(err)
					}
				} else if err := nc.Publish(o.subject, []byte("{}")); err != nil {
					t.Fatal(err)
				}
				if got := !denied(t, nc, o.subject); got != o.allowed {
					t.Errorf("sub=%v %s: allowed=%v, want %v (last error %v)", o.sub, o.subject, got, o.allowed, nc.LastError())
				}
				nc.Close()
			}
		})
	}
}

// TestAgentUsesTheBus checks the agent's allowed paths end to end: a
// JetStream publish with its ack across accounts, a late read of its
// result, live audit of its own tenant only, and control requests that
// reach the worker with a private reply subject and the caller's identity.
func TestAgentUsesTheBus(t *testing.T) { forEachAuth(t, testAgentUsesTheBus) }

func testAgentUsesTheBus(t *testing.T, b *bus) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	agent, claims := b.agent(t, "demo")
	worker := b.connect(t, b.creds(RoleAudit))

	t.Run("invoke with ack", func(t *testing.T) {
		js, _ := jetstream.New(agent)
		ack, err := js.Publish(ctx, subjects.Invoke("demo"), []byte(`{}`))
		if err != nil || ack.Stream != subjects.StreamInvoke {
			t.Fatalf("ack %+v, err %v", ack, err)
		}
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if _, err := js.Publish(short, subjects.Invoke("other"), []byte(`{}`)); err == nil {
			t.Fatal("publish to another tenant acknowledged")
		}
	})

	t.Run("live audit of its tenant only", func(t *testing.T) {
		// Live audit events name no agent in their subject: only a
		// tenant reader subscribes to them.
		raw, rc := b.mint(t, "demo", func(c *token.Claims) { c.TenantReader = true })
		reader := b.connect(t, nats.Token(raw), nats.CustomInboxPrefix(InboxPrefix("demo", rc.ID)))
		sub, err := reader.SubscribeSync(subjects.AuditTenant("demo"))
		if err != nil {
			t.Fatal(err)
		}
		reader.Flush()
		worker.Publish(subjects.AuditEvent("other", "tool.succeeded"), []byte("other"))
		worker.Publish(subjects.AuditEvent("demo", "tool.succeeded"), []byte("mine"))
		m, err := sub.NextMsg(2 * time.Second)
		if err != nil || string(m.Data) != "mine" {
			t.Fatalf("got %v, %v", m, err)
		}
	})

	t.Run("late result read", func(t *testing.T) {
		wjs, _ := jetstream.New(worker)
		if _, err := wjs.Publish(ctx, subjects.Result("demo", claims.AgentDID, "inv-1"), []byte(`{"status":"success"}`)); err != nil {
			t.Fatal(err)
		}
		m, err := agent.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+subjects.StreamResults+"."+subjects.Result("demo", claims.AgentDID, "inv-1"), nil)
		if err != nil || string(m.Data) != `{"status":"success"}` {
			t.Fatalf("direct get: %v %v", m, err)
		}
	})

	t.Run("control request carries identity and a private reply", func(t *testing.T) {
		seen := make(chan *nats.Msg, 1)
		ctl := b.connect(t, b.creds(RoleControl)) // the control service's role serves the endpoints
		svc, err := ctl.Subscribe(subjects.TenantSvc("*", subjects.SvcStatus), func(m *nats.Msg) {
			seen <- m
			m.Respond([]byte(`{"status":"pending"}`))
		})
		if err != nil {
			t.Fatal(err)
		}
		defer svc.Unsubscribe()
		ctl.Flush()
		resp, err := agent.RequestWithContext(ctx, subjects.TenantSvc("demo", subjects.SvcStatus), []byte(`{}`))
		if err != nil || string(resp.Data) != `{"status":"pending"}` {
			t.Fatalf("status: %v %v", resp, err)
		}
		m := <-seen
		if !strings.HasPrefix(m.Reply, "_R_.") {
			t.Errorf("reply subject %q is not a private service reply", m.Reply)
		}
		var info struct {
			Account string `json:"acc"`
			User    string `json:"user"`
			Name    string `json:"name"`
		}
		if err := json.Unmarshal([]byte(m.Header.Get("Nats-Request-Info")), &info); err != nil {
			t.Fatalf("Nats-Request-Info %q: %v", m.Header.Get("Nats-Request-Info"), err)
		}
		id, err := ParseUserName(info.User)
		if err != nil || id.Tenant != "demo" || id.TokenID != claims.ID || info.Account != TenantAccount("demo") {
			t.Errorf("request info %+v -> %+v, %v", info, id, err)
		}
		// A reply subject the agent picks stays in its own account: it
		// cannot make toolgate answer onto another tenant's results.
		forged := agent.PublishMsg(&nats.Msg{Subject: subjects.TenantSvc("demo", subjects.SvcStatus), Reply: subjects.Result("other", claims.AgentDID, "x")})
		if forged != nil {
			t.Fatal(forged)
		}
		if m := <-seen; !strings.HasPrefix(m.Reply, "_R_.") {
			t.Errorf("forged reply arrived as %q", m.Reply)
		}
	})
}

func TestBusRefusesConnections(t *testing.T) { forEachAuth(t, testBusRefusesConnections) }

func testBusRefusesConnections(t *testing.T, b *bus) {
	otherKey, _ := token.GenerateSigningKey(token.AlgEdDSA)
	otherKey.KID = b.signer.KID

	revokedTok, revokedClaims := b.mint(t, "demo", nil)
	b.rev.Set(revokedClaims.ID, true)
	parentTok := func() string {
		raw, c := b.mint(t, "demo", nil)
		_ = raw
		raw2, _ := b.mint(t, "demo", func(ch *token.Claims) { ch.Chain = []string{c.ID} })
		b.rev.Set(c.ID, true)
		return raw2
	}()
	expired, _ := b.mint(t, "demo", func(c *token.Claims) {
		c.ExpiresAt = gjwt.NewNumericDate(time.Now().Add(-time.Minute))
		c.IssuedAt = gjwt.NewNumericDate(time.Now().Add(-time.Hour))
	})
	wrongKey := func() string {
		c := token.Claims{ToolID: token.Patterns{"*"}, AgentDID: "did:x", TenantID: "demo"}
		c.Issuer, c.Audience = testIssuer, gjwt.ClaimStrings{testAudience}
		c.ExpiresAt = gjwt.NewNumericDate(time.Now().Add(time.Hour))
		raw, err := token.Mint(otherKey, c)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}()
	good, _ := b.mint(t, "demo", nil)
	parts := strings.Split(good, ".")
	tampered := parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(mustDecode(t, parts[1]), `"demo"`, `"other"`, 1))) + "." + parts[2]
	algNone := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT","kid":"`+b.signer.KID+`"}`)) + "." + parts[1] + "."
	evil, _ := b.mint(t, "evil", nil)

	dir := t.TempDir()
	foreign, _ := GenerateKeys()
	foreignCreds, _ := foreign.IssueCredentials(RoleOperator, "mallory", 0)
	expiredCreds, _ := b.keys.IssueCredentials(RoleOperator, "old", time.Second)
	tamperedCreds := tamperCreds(t, b.dir)
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	foreignPath, expiredPath, tamperedPath := write("foreign.creds", foreignCreds), write("expired.creds", expiredCreds), write("tampered.creds", tamperedCreds)
	time.Sleep(1100 * time.Millisecond) // let expiredCreds expire (JWT expiry has 1 s resolution)

	cases := []struct {
		name string
		opts []nats.Option
		want error
	}{
		{"no credentials", nil, ErrNoCredentials},
		{"user and password", []nats.Option{nats.UserInfo("admin", "admin")}, ErrNoCredentials},
		{"expired token", []nats.Option{nats.Token(expired)}, ErrExpired},
		{"revoked token", []nats.Option{nats.Token(revokedTok)}, ErrRevoked},
		{"token derived from a revoked one", []nats.Option{nats.Token(parentTok)}, ErrRevoked},
		{"token signed by another key", []nats.Option{nats.Token(wrongKey)}, ErrBadSignature},
		{"tampered token", []nats.Option{nats.Token(tampered)}, ErrBadSignature},
		{"alg none", []nats.Option{nats.Token(algNone)}, ErrBadSignature},
		{"tenant not served", []nats.Option{nats.Token(evil)}, ErrWrongTenant},
		{"garbage token", []nats.Option{nats.Token("not-a-jwt")}, ErrBadToken},
		{"credentials of another deployment", []nats.Option{CredentialsOption(foreignPath)}, ErrUnknownIssuer},
		{"expired credentials", []nats.Option{CredentialsOption(expiredPath)}, ErrExpired},
		{"tampered credentials", []nats.Option{CredentialsOption(tamperedPath)}, ErrBadSignature},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := b.dial(tc.opts...)
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			if !errors.Is(err, nats.ErrAuthorization) {
				t.Errorf("client error %v, want authorization violation", err)
			}
			if r := b.audit.last(); !errors.Is(r.Err, tc.want) {
				t.Errorf("audited %v, want %v", r.Err, tc.want)
			}
		})
	}
}

func mustDecode(t *testing.T, s string) string {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tamperCreds turns the execute role's credentials into an operator's by editing
// the JWT's payload without re-signing it.
func tamperCreds(t *testing.T, dataDir string) []byte {
	raw, err := os.ReadFile(filepath.Join(dataDir, DirName, CredsFile(RoleExecute)))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.ParseDecoratedJWT(raw)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := jwt.ParseDecoratedNKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	p := strings.Split(tok, ".")
	p[1] = base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(mustDecode(t, p[1]), "toolgate-role:execute", "toolgate-role:operator", 1)))
	seed, _ := kp.Seed()
	// jwt.FormatUserConfig refuses a JWT whose signature fails; write the
	// decorated file by hand.
	return []byte("-----BEGIN NATS USER JWT-----\n" + strings.Join(p, ".") + "\n------END NATS USER JWT------\n\n" +
		"-----BEGIN USER NKEY SEED-----\n" + string(seed) + "\n------END USER NKEY SEED------\n")
}

func TestRevokeClosesLiveConnection(t *testing.T) { forEachAuth(t, testRevokeClosesLiveConnection) }

func testRevokeClosesLiveConnection(t *testing.T, b *bus) {
	raw, c := b.mint(t, "demo", nil)
	closed := make(chan struct{})
	nc := b.connect(t, nats.Token(raw), nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	bystander, _ := b.agent(t, "demo")

	b.rev.Set(c.ID, true)
	start := time.Now()
	n, err := b.callout.Revoke(context.Background(), c.ID)
	if err != nil || n != 1 {
		t.Fatalf("revoke: %d, %v", n, err)
	}
	select {
	case <-closed:
	case <-time.After(time.Second):
		t.Fatal("revoked connection still open after 1s")
	}
	t.Logf("closed %v after revocation", time.Since(start))
	if nc.IsConnected() {
		t.Error("still connected")
	}
	if !bystander.IsConnected() {
		t.Error("another token's connection was closed")
	}
	if _, err := b.dial(nats.Token(raw)); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("reconnect with the revoked token: %v", err)
	}
}

// TestInProcessSystemUser: in-process, the system account's user proves its
// seed like every other nkey; its public key alone is refused.
func TestInProcessSystemUser(t *testing.T) {
	b := startBus(t, true)
	other, _ := nkeys.CreateUser()
	if _, err := b.dial(nats.Nkey(mustPublic(b.keys.SystemUser), other.Sign)); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("system nkey signed by another key: %v", err)
	}
	sys := b.connect(t, b.keys.SystemConnectOption())
	if _, err := sys.Request("$SYS.REQ.SERVER.PING", nil, 2*time.Second); err != nil {
		t.Fatalf("system request: %v", err)
	}
}

// TestAgentRepliesStayInTenant: an agent that names another tenant's inbox
// as the reply subject of an invocation or a control request gets nothing
// delivered there, neither JetStream's ack nor the service's answer: the
// reply goes back into the requester's own account.
func TestAgentRepliesStayInTenant(t *testing.T) { forEachAuth(t, testAgentRepliesStayInTenant) }

func testAgentRepliesStayInTenant(t *testing.T, b *bus) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	attacker, ac := b.agent(t, "demo")
	victim, vc := b.agent(t, "other")
	stolen, err := victim.SubscribeSync(InboxPrefix("other", vc.ID) + ".>")
	if err != nil {
		t.Fatal(err)
	}
	if err := victim.Flush(); err != nil {
		t.Fatal(err)
	}
	ctl := b.connect(t, b.creds(RoleControl))
	answered := make(chan string, 4)
	if _, err := ctl.Subscribe(subjects.TenantSvc("*", subjects.SvcStatus), func(m *nats.Msg) {
		answered <- m.Reply
		_ = m.Respond([]byte(`{"status":"pending"}`))
	}); err != nil {
		t.Fatal(err)
	}
	if err := ctl.Flush(); err != nil {
		t.Fatal(err)
	}
	target := InboxPrefix("other", vc.ID) + ".stolen"
	for _, subj := range []string{subjects.Invoke("demo"), subjects.TenantSvc("demo", subjects.SvcStatus)} {
		if err := attacker.PublishMsg(&nats.Msg{Subject: subj, Reply: target, Data: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	// Both requests were served: the ack and the answer exist, and the
	// attacker's own requests on the same paths still get theirs.
	js, _ := jetstream.New(attacker)
	if _, err := js.Publish(ctx, subjects.Invoke("demo"), []byte(`{}`)); err != nil {
		t.Fatalf("own invoke: %v", err)
	}
	if _, err := attacker.RequestWithContext(ctx, subjects.TenantSvc("demo", subjects.SvcStatus), []byte(`{}`)); err != nil {
		t.Fatalf("own status request: %v", err)
	}
	if n := len(answered); n != 2 {
		t.Fatalf("control service answered %d requests, want 2", n)
	}
	if m, err := stolen.NextMsg(300 * time.Millisecond); err == nil {
		t.Fatalf("tenant other's inbox received a reply to tenant demo's request (%s): %q", ac.ID, m.Data)
	}
}

// TestTenantAccountImports: a tenant's account imports from TOOLGATE exactly
// its own tenant's invoke subject, control endpoints, direct reads of
// results, live results and audit, nothing of another tenant's.
func TestTenantAccountImports(t *testing.T) { forEachAuth(t, testTenantAccountImports) }

func testTenantAccountImports(t *testing.T, b *bus) {
	b.agent(t, "demo") // in-process, the first agent makes the account
	b.agent(t, "other")
	want := map[string]string{}
	for _, s := range []string{"tool.invoke.demo", "tool.svc.demo.status", "tool.svc.demo.cancel", "tool.svc.demo.receipt", "tool.svc.demo.tools.list",
		"tool.svc.demo.tools.get", "tool.svc.demo.budget", "tool.svc.demo.approvals.list", "tool.svc.demo.approvals.get", "tool.svc.demo.audit.history",
		"tool.svc.demo.capability.request", "tool.svc.demo.capability.report",
		"tool.svc.demo.checkpoints.list", "tool.svc.demo.checkpoints.get", "tool.svc.demo.checkpoints.delete",
		"tool.svc.demo.tokens.keys",
		"$JS.API.DIRECT.GET.TOOLGATE_RESULTS.tool.result.demo.>"} {
		want[s] = "service"
	}
	want["tool.result.demo.>"] = "stream"
	want["audit.demo.>"] = "stream"
	az, err := b.srv.Accountz(&server.AccountzOptions{Account: TenantAccount("demo")})
	if err != nil {
		t.Fatal(err)
	}
	if az.Account == nil {
		t.Fatalf("no account %s", TenantAccount("demo"))
	}
	got := map[string]string{}
	for _, im := range az.Account.Imports {
		if im.Account == "" || im.Invalid {
			t.Errorf("import %+v invalid or from no account", im.Import)
		}
		if im.Account == AccountSystem && strings.HasPrefix(string(im.Subject), "$") {
			continue // the server's own imports into every account
		}
		if im.Account != AccountToolgate {
			t.Errorf("import %s from account %s", im.Subject, im.Account)
			continue
		}
		got[string(im.Subject)] = im.Type.String()
		if im.Type == jwt.Service && !im.Share {
			t.Errorf("service import %s does not share the caller's identity", im.Subject)
		}
	}
	if len(got) != len(want) {
		t.Errorf("imports %v, want %v", got, want)
	}
	for s, typ := range want {
		if got[s] != typ {
			t.Errorf("import %s: %q, want %q", s, got[s], typ)
		}
	}
	// No one else lives in the tenant's account.
	if az.Account.ClientCnt != 1 {
		t.Errorf("%d clients in %s, want the one agent", az.Account.ClientCnt, TenantAccount("demo"))
	}
}
