package connect

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	natsjwt "github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/spf13/pflag"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/token"
)

func clearEnv(t *testing.T) {
	for _, k := range []string{EnvURL, EnvCreds, EnvContext, EnvToken, EnvTenant} {
		t.Setenv(k, "")
	}
}

func mint(t *testing.T, tenant, jti string) string {
	t.Helper()
	k, err := token.GenerateSigningKey(token.AlgEdDSA)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := token.Mint(k, token.Claims{ToolID: token.Patterns{"*"}, TenantID: tenant, AgentDID: "did:agent:a",
		RegisteredClaims: jwt.RegisteredClaims{ID: jti, Issuer: "toolgate", Audience: jwt.ClaimStrings{"toolgate"},
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// apply runs the options onto a nats.Options, to see what a connection
// would send.
func apply(t *testing.T, o *Options) nats.Options {
	t.Helper()
	opts, err := o.NATSOptions()
	if err != nil {
		t.Fatal(err)
	}
	no := nats.GetDefaultOptions()
	for _, f := range opts {
		if err := f(&no); err != nil {
			t.Fatal(err)
		}
	}
	return no
}

// TestTenant: --tenant wins, else the token's tenant_id (the flag's token,
// else the fallback), else ErrNoTenant; the environment fills flags not
// given.
func TestTenant(t *testing.T) {
	clearEnv(t)
	acme := mint(t, "acme", "j1")
	for _, tc := range []struct {
		name          string
		o             Options
		env           map[string]string
		fallback      string
		want          string
		wantNoTenant  bool
		wantTokenFail bool
	}{
		{name: "flag", o: Options{Tenant: "t1", Token: acme}, want: "t1"},
		{name: "token", o: Options{Token: acme}, want: "acme"},
		{name: "fallback token", fallback: acme, want: "acme"},
		{name: "env tenant", env: map[string]string{EnvTenant: "envt"}, fallback: acme, want: "envt"},
		{name: "env token", env: map[string]string{EnvToken: acme}, want: "acme"},
		{name: "neither", wantNoTenant: true},
		{name: "garbage token", o: Options{Token: "x.y"}, wantTokenFail: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			o := tc.o
			o.Resolve()
			got, err := o.TenantFor(tc.fallback)
			switch {
			case tc.wantNoTenant:
				if !errors.Is(err, ErrNoTenant) {
					t.Fatalf("got %q, %v; want ErrNoTenant", got, err)
				}
			case tc.wantTokenFail:
				if err == nil || errors.Is(err, ErrNoTenant) {
					t.Fatalf("got %q, %v; want a token error", got, err)
				}
			case err != nil || got != tc.want:
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestFlagsFromEnvironment: flags left out are read from the environment;
// given ones win; help defaults do not depend on it.
func TestFlagsFromEnvironment(t *testing.T) {
	clearEnv(t)
	t.Setenv(EnvURL, "nats://env:4222")
	t.Setenv(EnvCreds, "/env.creds")
	var o Options
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	o.AddFlags(fs)
	if fs.Lookup("nats").DefValue != "" {
		t.Fatal("the --nats default shows the environment")
	}
	if err := fs.Parse([]string{"--creds", "/flag.creds"}); err != nil {
		t.Fatal(err)
	}
	o.Resolve()
	if o.ServerURL() != "nats://env:4222" || o.Creds != "/flag.creds" {
		t.Fatalf("url %q creds %q", o.ServerURL(), o.Creds)
	}
}

// TestAgentToken: an agent connects with its token as the connect token
// and the inbox prefix only that token may use; --inbox-prefix overrides it.
func TestAgentToken(t *testing.T) {
	clearEnv(t)
	tok := mint(t, "acme", "tok.1")
	no := apply(t, &Options{Token: tok})
	if no.Token != tok || no.InboxPrefix != busauth.InboxPrefix("acme", "tok.1") {
		t.Fatalf("token %q inbox %q", no.Token, no.InboxPrefix)
	}
	if no := apply(t, &Options{Token: tok, InboxPrefix: "_X"}); no.InboxPrefix != "_X" {
		t.Fatalf("inbox %q, want _X", no.InboxPrefix)
	}
}

// TestCreds: a toolgate-issued .creds file is sent as nkey plus
// JWT-as-token; any other as a user JWT.
func TestCreds(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	k, err := busauth.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	b, err := k.IssueCredentials(busauth.RoleOperator, "ops", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ours := filepath.Join(dir, "operator.creds")
	if err := os.WriteFile(ours, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if !IsToolgateCreds(b) {
		t.Fatal("toolgate-issued creds not recognised")
	}
	no := apply(t, &Options{Creds: ours})
	if no.Nkey == "" || no.Token == "" || no.SignatureCB == nil || no.UserJWT != nil {
		t.Fatalf("toolgate creds: nkey %q token set %v", no.Nkey, no.Token != "")
	}

	// A plain user .creds file, not issued by toolgate.
	akp, _ := nkeys.CreateAccount()
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	ujwt, err := natsjwt.NewUserClaims(upub).Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := ukp.Seed()
	plain, err := natsjwt.FormatUserConfig(ujwt, seed)
	if err != nil {
		t.Fatal(err)
	}
	if IsToolgateCreds(plain) {
		t.Fatal("foreign creds taken for toolgate's")
	}
	theirs := filepath.Join(dir, "user.creds")
	if err := os.WriteFile(theirs, plain, 0o600); err != nil {
		t.Fatal(err)
	}
	no = apply(t, &Options{Creds: theirs})
	if no.UserJWT == nil || no.Nkey != "" || no.Token != "" {
		t.Fatalf("plain creds: nkey %q token %q userJWT set %v", no.Nkey, no.Token, no.UserJWT != nil)
	}
}

// TestContext: a nats CLI context names the server; an unreachable server
// is a connect *Error.
func TestContext(t *testing.T) {
	clearEnv(t)
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	cfg := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfg)
	if err := os.MkdirAll(filepath.Join(cfg, "nats", "context"), 0o700); err != nil {
		t.Fatal(err)
	}
	ctxFile := filepath.Join(cfg, "nats", "context", "local.json")
	if err := os.WriteFile(ctxFile, []byte(`{"url":"`+ns.ClientURL()+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	nc, err := (&Options{Context: "local"}).Connect()
	if err != nil {
		t.Fatal(err)
	}
	if nc.ConnectedUrl() != ns.ClientURL() {
		t.Fatalf("connected to %s, want %s", nc.ConnectedUrl(), ns.ClientURL())
	}
	nc.Close()
	// --nats overrides the context's server.
	_, err = (&Options{Context: "local", URL: "nats://127.0.0.1:1"}).Connect()
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("got %v, want a connect error", err)
	}
}

// TestNkeyAndLocalCreds: the nats CLI's NATS_NKEY and NATS_TOKEN are read;
// LocalCreds is used only when nothing else names an identity.
func TestNkeyAndLocalCreds(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	ukp, _ := nkeys.CreateUser()
	seed, _ := ukp.Seed()
	nk := filepath.Join(dir, "op.nk")
	if err := os.WriteFile(nk, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvNkey, nk)
	t.Setenv(EnvNATSToken, "the-jwt")
	var o Options
	o.Resolve()
	no := apply(t, &o)
	upub, _ := ukp.PublicKey()
	if no.Nkey != upub || no.Token != "the-jwt" {
		t.Fatalf("nkey %q token %q", no.Nkey, no.Token)
	}

	clearEnv(t)
	k, _ := busauth.GenerateKeys()
	b, _ := k.IssueCredentials(busauth.RoleOperator, "local", 0)
	local := filepath.Join(dir, "operator.creds")
	if err := os.WriteFile(local, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if no := apply(t, &Options{LocalCreds: local}); no.Nkey == "" || no.Token == "" {
		t.Fatal("LocalCreds not used when nothing else is given")
	}
	tok := mint(t, "acme", "j")
	if no := apply(t, &Options{LocalCreds: local, Token: tok}); no.Token != tok {
		t.Fatal("LocalCreds used although a token was given")
	}
}
