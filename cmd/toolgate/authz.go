package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/breaker"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
)

func tokenCmd(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("token: keygen | mint | inspect | revoke")
	}
	switch args[0] {
	case "keygen":
		return tokenKeygen(args[1:])
	case "mint":
		return tokenMint(args[1:])
	case "inspect":
		return tokenInspect(args[1:])
	case "revoke":
		return tokenRevoke(ctx, args[1:])
	}
	return fmt.Errorf("token: unknown command %q (keygen, mint, inspect, revoke)", args[0])
}

func tokenKeygen(args []string) error {
	fs := flag.NewFlagSet("token keygen", flag.ContinueOnError)
	alg := fs.String("alg", token.AlgEdDSA, "EdDSA or RS256")
	out := fs.String("out", "signing-key.jwk", "private key file to write (mode 0600)")
	jwks := fs.String("jwks", "jwks.json", "public key set to write, for serve --jwks")
	force := fs.Bool("force", false, "replace an existing key and key set (every token signed with the old key stops verifying)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// A new key invalidates every token issued with the old one: replacing
	// it must be asked for.
	if !*force {
		for _, p := range []string{*out, *jwks} {
			if _, err := os.Lstat(p); err == nil {
				return fmt.Errorf("token keygen: %s exists; replacing the key invalidates every token it signed (use --force)", p)
			} else if !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("token keygen: %w", err)
			}
		}
	}
	k, err := token.GenerateSigningKey(*alg)
	if err != nil {
		return err
	}
	priv, err := k.MarshalPrivate()
	if err != nil {
		return err
	}
	pub, err := k.PublicJWKS()
	if err != nil {
		return err
	}
	if err := os.WriteFile(*out, priv, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(*jwks, pub, 0o644); err != nil {
		return err
	}
	fmt.Printf("key %s (%s): private key in %s, public key set in %s\n", k.KID, k.Alg, *out, *jwks)
	return nil
}

// list is a comma-separated flag value.
type list []string

func (l *list) String() string { return strings.Join(*l, ",") }
func (l *list) Set(s string) error {
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l = append(*l, v)
		}
	}
	return nil
}

func tokenMint(args []string) error {
	fs := flag.NewFlagSet("token mint", flag.ContinueOnError)
	keyPath := fs.String("key", "", "private signing key (JWK), from token keygen")
	parent := fs.String("parent", "", "derive from this token, narrowing it; fields not given are inherited")
	issuer := fs.String("issuer", "toolgate", "iss")
	audience := fs.String("audience", "toolgate", "aud")
	tenant := fs.String("tenant", "", "tenant id")
	agent := fs.String("agent", "", "agent DID")
	session := fs.String("session", "", "bind to this session")
	version := fs.String("version", "", "semver range of granted versions")
	ttl := fs.Duration("ttl", time.Hour, "lifetime")
	mode := fs.String("mode", "", "filesystem mode: ro or rw")
	var tools, paths, hosts, ports, secrets, exclude, preApprove, ops list
	fs.Var(&tools, "tools", "granted tool ids or patterns (fs.*), comma-separated")
	fs.Var(&paths, "paths", "granted paths under the file root")
	fs.Var(&hosts, "hosts", "granted hosts (api.example.com, *.example.com)")
	fs.Var(&ports, "ports", "granted ports")
	fs.Var(&secrets, "secrets", "granted credentials by name")
	fs.Var(&exclude, "exclude", "excluded side effects (network, fs.write, ...)")
	fs.Var(&preApprove, "pre-approve", "tools whose high-risk calls need no approval")
	fs.Var(&ops, "operations", "allowed operations (default: execute)")
	var b token.Budget
	fs.Int64Var(&b.MaxCalls, "max-calls", 0, "session budget: calls")
	fs.Int64Var(&b.MaxRuntimeMS, "max-runtime-ms", 0, "session budget: tool runtime")
	fs.Float64Var(&b.MaxCost, "max-cost", 0, "session budget: cost")
	fs.Int64Var(&b.MaxTokens, "max-tokens", 0, "session budget: model tokens")
	fs.Int64Var(&b.ApprovalAfterFailures, "approval-after-failures", 0, "require approval after this many failures in a row")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *keyPath == "" {
		return errors.New("token mint: --key is required")
	}
	k, err := token.LoadSigningKey(*keyPath)
	if err != nil {
		return err
	}
	c := token.Claims{
		ToolID: token.Patterns(tools), ToolVersion: *version, TenantID: *tenant, AgentDID: *agent, SessionID: *session,
		AllowedOperations: ops, ExcludedSideEffects: exclude, PreApproved: token.Patterns(preApprove),
		RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(time.Now().Add(*ttl))},
	}
	if len(paths) > 0 || *mode != "" {
		c.Filesystem = &token.FilesystemGrant{AllowedPaths: paths, Mode: *mode}
	}
	if len(hosts) > 0 || len(ports) > 0 {
		c.Network = &token.NetworkGrant{AllowedHosts: hosts}
		for _, p := range ports {
			n, err := strconv.Atoi(p)
			if err != nil {
				return fmt.Errorf("--ports: %w", err)
			}
			c.Network.AllowedPorts = append(c.Network.AllowedPorts, n)
		}
	}
	if len(secrets) > 0 {
		c.Credentials = &token.CredentialGrant{AllowedSecrets: secrets}
	}
	if b != (token.Budget{}) {
		c.Budget = &b
	}
	if *parent != "" {
		// The parent must verify under this key: only its issuer narrows it.
		pc, err := parseUnverified(*parent)
		if err != nil {
			return err
		}
		v := &token.Verifier{Keys: token.StaticKeys{Set: k.KeySet()}, Issuer: pc.Issuer, Audience: first(pc.Audience)}
		verified, err := v.Verify(*parent)
		if err != nil {
			return fmt.Errorf("parent token: %w", err)
		}
		if !isSet(fs, "ttl") {
			c.ExpiresAt = nil // inherit the parent's expiry
		}
		if c, err = token.Attenuate(verified, c); err != nil {
			return err
		}
	} else {
		c.Issuer, c.Audience, c.Subject = *issuer, jwt.ClaimStrings{*audience}, *agent
		if len(c.AllowedOperations) == 0 {
			c.AllowedOperations = []string{token.OperationExecute}
		}
	}
	raw, err := token.Mint(k, c)
	if err != nil {
		return err
	}
	fmt.Println(raw)
	return nil
}

func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// parseUnverified decodes a token's claims without checking its signature,
// for display and to find what to verify it against.
func parseUnverified(raw string) (*token.Claims, error) {
	var c token.Claims
	if _, _, err := jwt.NewParser().ParseUnverified(strings.TrimSpace(raw), &c); err != nil {
		return nil, fmt.Errorf("not a JWT: %w", err)
	}
	return &c, nil
}

func tokenInspect(args []string) error {
	fs := flag.NewFlagSet("token inspect", flag.ContinueOnError)
	jwks := fs.String("jwks", "", "verify against this key set too")
	issuer := fs.String("issuer", "toolgate", "expected iss when verifying")
	audience := fs.String("audience", "toolgate", "expected aud when verifying")
	if err := fs.Parse(reorder(args)); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("token inspect: give one token")
	}
	raw := strings.TrimSpace(fs.Arg(0))
	t, _, err := jwt.NewParser().ParseUnverified(raw, &token.Claims{})
	if err != nil {
		return fmt.Errorf("not a JWT: %w", err)
	}
	out := map[string]any{"header": t.Header, "claims": t.Claims, "verified": false}
	if *jwks != "" {
		ks, err := token.LoadKeySet(*jwks)
		if err != nil {
			return err
		}
		v := &token.Verifier{Keys: token.StaticKeys{Set: ks}, Issuer: *issuer, Audience: *audience}
		if _, err := v.Verify(raw); err != nil {
			out["error"] = err.Error()
		} else {
			out["verified"] = true
		}
	}
	return printJSON(out)
}

func tokenRevoke(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("token revoke", flag.ContinueOnError)
	url := fs.String("nats", natsURL(), "NATS server URL (default: $NATS_URL, else "+nats.DefaultURL+")")
	jti := fs.String("jti", "", "token id to revoke (instead of a token)")
	reason := fs.String("reason", "", "why")
	if err := fs.Parse(reorder(args)); err != nil {
		return err
	}
	until := time.Now().Add(30 * 24 * time.Hour)
	id := *jti
	if fs.NArg() == 1 {
		c, err := parseUnverified(fs.Arg(0))
		if err != nil {
			return err
		}
		id = c.ID
		if c.ExpiresAt != nil {
			until = c.ExpiresAt.Time
		}
	}
	if id == "" {
		return errors.New("token revoke: give a token or --jti")
	}
	store, done, err := openStore(ctx, *url)
	if err != nil {
		return err
	}
	defer done()
	if err := store.Revoke(ctx, id, until, *reason); err != nil {
		return err
	}
	fmt.Printf("revoked %s (and every token derived from it) until %s\n", id, until.UTC().Format(time.RFC3339))
	return nil
}

// openStore connects to NATS and opens toolgate's buckets.
func openStore(ctx context.Context, url string) (*kvstore.Store, func(), error) {
	nc, err := connectBus(url)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	store, err := kvstore.Open(ctx, js, kvstore.Options{})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return store, nc.Close, nil
}

func policyCmd(ctx context.Context, args []string) error {
	if len(args) == 0 || (args[0] != "push" && args[0] != "show") {
		return errors.New("policy: push DIR | show")
	}
	fs := flag.NewFlagSet("policy "+args[0], flag.ContinueOnError)
	url := fs.String("nats", natsURL(), "NATS server URL (default: $NATS_URL, else "+nats.DefaultURL+")")
	by := fs.String("by", whoami(), "who pushes, for the record")
	if err := fs.Parse(reorder(args[1:])); err != nil {
		return err
	}
	store, done, err := openStore(ctx, *url)
	if err != nil {
		return err
	}
	defer done()
	if args[0] == "show" {
		b, ok, err := store.Policy(ctx)
		if err != nil {
			return err
		}
		if !ok {
			fmt.Println("no policy pushed: workers use their configured policy (default: the shipped one)")
			return nil
		}
		return printJSON(map[string]any{"revision": b.Revision, "pushed_at": b.PushedAt, "pushed_by": b.PushedBy, "modules": b.Modules, "data": b.Data})
	}
	if fs.NArg() != 1 {
		return errors.New("policy push: give a directory of .rego files (and optionally data.json)")
	}
	modules, data, err := policy.ReadDir(fs.Arg(0))
	if err != nil {
		return err
	}
	// Compile here first: a policy that does not compile never reaches a worker.
	if _, err := policy.New(ctx, modules, data); err != nil {
		return err
	}
	rev, err := store.PushPolicy(ctx, kvstore.PolicyBundle{Modules: modules, Data: data, PushedBy: *by})
	if err != nil {
		return err
	}
	fmt.Printf("policy pushed (revision %d, %d modules); workers reload it now\n", rev, len(modules))
	return nil
}

func decideCmd(ctx context.Context, args []string, approve bool) error {
	name := map[bool]string{true: "approve", false: "deny"}[approve]
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	url := fs.String("nats", natsURL(), "NATS server URL (default: $NATS_URL, else "+nats.DefaultURL+")")
	tenant := fs.String("tenant", node.DevTenant, "tenant id")
	reason := fs.String("reason", "", "why, for the record")
	by := fs.String("by", whoami(), "who decides, for the record")
	if err := fs.Parse(reorder(args)); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%s: give an invocation id", name)
	}
	c, closeFn, err := connect(*url)
	if err != nil {
		return err
	}
	defer closeFn()
	sign, err := requestSigner()
	if err != nil {
		return err
	}
	a, err := c.DecideSigned(ctx, api.ApprovalDecision{
		Tenant: *tenant, InvocationID: fs.Arg(0), Approve: approve, DecidedBy: *by, Reason: *reason,
	}, sign)
	if err != nil {
		return err
	}
	return printJSON(a)
}

func whoami() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	if h, err := os.Hostname(); err == nil {
		name += "@" + h
	}
	return name
}

// reorder moves flags before positional arguments, so `approve ID --reason x`
// parses like `approve --reason x ID`.
func reorder(args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		if !strings.Contains(a, "=") && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			flags = append(flags, args[i+1])
			i++
		}
	}
	return append(flags, pos...)
}

// devToken finds the token for invoke: --token, $TOOLGATE_TOKEN, or the
// development token serve --examples wrote into its data directory.
func devToken(flagValue, dataDir string) string {
	if flagValue != "" {
		return flagValue
	}
	if b, err := os.ReadFile(node.DevTokenPath(dataDir)); err == nil {
		return strings.TrimSpace(string(b))
	}
	return ""
}

func cancelCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cancel", flag.ContinueOnError)
	url := fs.String("nats", natsURL(), "NATS server URL (default: $NATS_URL, else "+nats.DefaultURL+")")
	tenant := fs.String("tenant", node.DevTenant, "tenant id")
	reason := fs.String("reason", "", "why, for the record")
	if err := fs.Parse(reorder(args)); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("cancel: give an invocation id")
	}
	c, closeFn, err := connect(*url)
	if err != nil {
		return err
	}
	defer closeFn()
	rec, err := c.Cancel(ctx, *tenant, fs.Arg(0), *reason)
	if err != nil {
		return err
	}
	return printJSON(rec)
}

func breakersCmd(ctx context.Context, args []string) error {
	action := "list"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		action, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("breakers "+action, flag.ContinueOnError)
	url := fs.String("nats", natsURL(), "NATS server URL (default: $NATS_URL, else "+nats.DefaultURL+")")
	by := fs.String("by", whoami(), "who sets it, for the record")
	if err := fs.Parse(reorder(args)); err != nil {
		return err
	}
	nc, err := connectBus(*url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	store, err := kvstore.Open(ctx, js, kvstore.Options{})
	if err != nil {
		return err
	}
	if action == "list" {
		bs, err := store.Breakers(ctx)
		if err != nil {
			return err
		}
		return printJSON(bs)
	}
	state, ok := map[string]string{"open": kvstore.BreakerOpen, "close": kvstore.BreakerClosed, "release": ""}[action]
	if !ok || fs.NArg() != 1 {
		return errors.New("breakers: list | open KEY | close KEY | release KEY")
	}
	publish := func(ctx context.Context, o stages.Output) error { return runner.Publish(ctx, js, o) }
	st, err := breaker.Force(ctx, store, publish, fs.Arg(0), state, *by)
	if err != nil {
		return err
	}
	return printJSON(st)
}
