package authorize

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/stages/execute/kind"
	"github.com/toolgate/toolgate/stages/execute/kinds"
)

// fakeStore keeps usage, approvals and status records in memory.
type fakeStore struct {
	usage map[string]kvstore.Usage
	// recent, when it holds a key, is an older view of its usage, as a
	// process that last wrote it before another did would remember it.
	recent    map[string]kvstore.Usage
	approvals map[string]kvstore.Approval
	records   map[string]api.Record
	down      error
}

func newFakeStore() *fakeStore {
	return &fakeStore{usage: map[string]kvstore.Usage{}, approvals: map[string]kvstore.Approval{}, records: map[string]api.Record{}}
}

func (f *fakeStore) Usage(_ context.Context, tenant, session string) (kvstore.Usage, error) {
	return f.usage[tenant+"/"+session], f.down
}

func (f *fakeStore) RecentUsage(ctx context.Context, tenant, session string) (kvstore.Usage, error) {
	if u, ok := f.recent[tenant+"/"+session]; ok {
		return u, f.down
	}
	return f.Usage(ctx, tenant, session)
}

func (f *fakeStore) UpdateUsage(_ context.Context, tenant, session string, change func(*kvstore.Usage) error) (kvstore.Usage, error) {
	if f.down != nil {
		return kvstore.Usage{}, f.down
	}
	u := f.usage[tenant+"/"+session]
	if err := change(&u); err != nil {
		return u, err
	}
	f.usage[tenant+"/"+session] = u
	return u, nil
}

func (f *fakeStore) Approval(_ context.Context, tenant, id string) (kvstore.Approval, error) {
	a, ok := f.approvals[tenant+"/"+id]
	if !ok {
		return kvstore.Approval{}, kvstore.ErrNoApproval
	}
	return a, nil
}

func (f *fakeStore) RequestApproval(_ context.Context, a kvstore.Approval) (kvstore.Approval, bool, error) {
	if cur, ok := f.approvals[a.Tenant+"/"+a.InvocationID]; ok {
		return cur, false, nil
	}
	a.State = kvstore.ApprovalPending
	f.approvals[a.Tenant+"/"+a.InvocationID] = a
	return a, true, nil
}

func (f *fakeStore) SetStatus(_ context.Context, rec api.Record) (api.Record, bool, error) {
	f.records[rec.InvocationID] = rec
	return rec, true, nil
}

const (
	issuer   = "urn:test:issuer"
	audience = "urn:test:toolgate"
)

func TestAuthorize(t *testing.T) {
	ctx := context.Background()
	key, err := token.GenerateSigningKey(token.AlgEdDSA)
	if err != nil {
		t.Fatal(err)
	}
	engine, err := policy.Default(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reg := tools.NewRegistry()
	reg.Put(&tools.Manifest{ID: "echo", Version: "1.0.0", Kind: "builtin", Cost: &tools.Cost{PerCall: 2}})
	reg.Put(&tools.Manifest{ID: "wipe", Version: "1.0.0", Kind: "builtin",
		Safety: tools.Safety{RiskLevel: "critical", SideEffects: []string{"fs.delete"}}})
	// An http tool whose manifest declares no side effect: its kind
	// reaches the network all the same.
	fetch, err := tools.Parse([]byte(`{"id":"fetch","name":"fetch","version":"1.0.0","description":"fetches","kind":"http",
		"http":{"method":"GET","url":"https://api.example.com/x"},"input_schema":{"type":"object"},
		"permissions":{"network":[{"host":"api.example.com"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	reg.Put(fetch)

	mint := func(edit func(*token.Claims)) string {
		c := token.Claims{ToolID: token.Patterns{"*"}, TenantID: "acme", AgentDID: "did:agent:a",
			RegisteredClaims: jwt.RegisteredClaims{ID: "tok-1", Issuer: issuer, Audience: jwt.ClaimStrings{audience},
				ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}}
		if edit != nil {
			edit(&c)
		}
		raw, err := token.Mint(key, c)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	approval := func(state string) func(*fakeStore) {
		return func(f *fakeStore) {
			f.approvals["acme/i-1"] = kvstore.Approval{InvocationID: "i-1", Tenant: "acme", State: state, DecidedBy: "alice", Reason: "r"}
		}
	}

	budgeted := mint(func(c *token.Claims) { c.Budget = &token.Budget{MaxCalls: 10} })
	cases := []struct {
		name      string
		tool      string
		token     string
		revoke    bool
		store     func(*fakeStore)
		wantECode string
		transient bool
		parked    bool
		admitted  bool
		approver  string
		calls     int64
		unmetered bool
	}{
		{name: "admitted and charged", tool: "echo", token: budgeted, admitted: true, calls: 1},
		{name: "admitted without a budget, nothing read or written", tool: "echo", token: mint(nil),
			store: func(f *fakeStore) { f.down = errors.New("kv down") }, admitted: true, unmetered: true},
		{name: "no token", tool: "echo", token: "", wantECode: api.ETokenInvalid},
		{name: "forged token", tool: "echo", token: mint(nil) + "x", wantECode: api.ETokenInvalid},
		{name: "expired token", tool: "echo", token: mint(func(c *token.Claims) {
			c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-time.Hour))
		}), wantECode: api.ETokenExpired},
		{name: "revoked token", tool: "echo", token: mint(nil), revoke: true, wantECode: api.ETokenRevoked},
		{name: "token for another tool", tool: "echo", token: mint(func(c *token.Claims) { c.ToolID = token.Patterns{"other"} }),
			wantECode: api.ENotGranted},
		{name: "policy denies an excluded side effect", tool: "wipe", token: mint(func(c *token.Claims) {
			c.ExcludedSideEffects = []string{"fs"}
		}), wantECode: api.EPolicyDenied},
		{name: "a token excluding the network cannot call an http tool", tool: "fetch", token: mint(func(c *token.Claims) {
			c.ExcludedSideEffects = []string{"network"}
			c.Network = &token.NetworkGrant{AllowedHosts: []string{"api.example.com"}}
		}), wantECode: api.EPolicyDenied},
		{name: "policy denies a spent budget", tool: "echo", token: mint(func(c *token.Claims) { c.Budget = &token.Budget{MaxCalls: 3} }),
			store: func(f *fakeStore) { f.usage["acme/token:tok-1"] = kvstore.Usage{Calls: 3} }, wantECode: api.EBudgetExhausted},
		{name: "reservation refuses a call over the cost budget", tool: "echo",
			token: mint(func(c *token.Claims) { c.Budget = &token.Budget{MaxCost: 3} }),
			store: func(f *fakeStore) { f.usage["acme/token:tok-1"] = kvstore.Usage{Cost: 2} }, wantECode: api.EBudgetExhausted},
		{name: "already reserved is not charged again", tool: "echo", token: budgeted,
			store: func(f *fakeStore) { f.usage["acme/token:tok-1"] = kvstore.Usage{Calls: 1, Reserved: []string{"i-1"}} }, admitted: true, calls: 1},
		{name: "judged again when the usage moved since this process saw it", tool: "echo",
			token: mint(func(c *token.Claims) { c.Budget = &token.Budget{MaxCalls: 10, ApprovalAfterFailures: 3} }),
			store: func(f *fakeStore) {
				f.usage["acme/token:tok-1"] = kvstore.Usage{Calls: 4, ConsecutiveFailures: 3}
				f.recent = map[string]kvstore.Usage{"acme/token:tok-1": {Calls: 1}}
			}, parked: true, calls: 4},
		{name: "a stale count of calls alone is not judged again", tool: "echo", token: budgeted,
			store: func(f *fakeStore) {
				f.usage["acme/token:tok-1"] = kvstore.Usage{Calls: 4}
				f.recent = map[string]kvstore.Usage{"acme/token:tok-1": {Calls: 1}}
			}, admitted: true, calls: 5},
		{name: "critical tool is parked for approval", tool: "wipe", token: mint(nil), parked: true},
		{name: "pending approval parks again", tool: "wipe", token: mint(nil), store: approval(kvstore.ApprovalPending), parked: true},
		{name: "approved call is admitted", tool: "wipe", token: budgeted, store: approval(kvstore.ApprovalApproved),
			admitted: true, approver: "alice", calls: 1},
		{name: "denied call ends", tool: "wipe", token: mint(nil), store: approval(kvstore.ApprovalDenied), wantECode: api.EApprovalDenied},
		{name: "expired approval ends", tool: "wipe", token: mint(nil), store: approval(kvstore.ApprovalExpired), wantECode: api.EApprovalExpired},
		{name: "store down is transient", tool: "echo", token: budgeted, store: func(f *fakeStore) { f.down = errors.New("kv down") },
			transient: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := newFakeStore()
			if c.store != nil {
				c.store(st)
			}
			revoked := new(token.Revocations)
			if c.revoke {
				revoked.Set("tok-1", true)
			}
			a := New(Config{Registry: reg, Kinds: kinds.Compiled(), Policy: engine, Store: st, Revoked: revoked,
				Verifier: &token.Verifier{Keys: token.StaticKeys{Set: key.KeySet()}, Issuer: issuer, Audience: audience}})
			inv := &envelope.Invocation{ID: "i-1", Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: 3},
				Request: &api.Request{ToolID: c.tool, CapabilityToken: c.token,
					AgentContext: api.AgentContext{AgentDID: "did:agent:a", TenantID: "acme"}}}
			outs, err := a.Process(ctx, inv)
			if _, transient := stages.IsTransient(err); transient != c.transient {
				t.Fatalf("transient %v, want %v (%v)", transient, c.transient, err)
			}
			switch {
			case c.transient:
				return
			case c.wantECode != "":
				var ae *api.Error
				if !errors.As(err, &ae) || ae.ECode != c.wantECode {
					t.Fatalf("err %v, want %s", err, c.wantECode)
				}
				if inv.Authz != nil {
					t.Fatal("refused call carries an authorization")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.parked {
				if !inv.Parked() || len(outs) != 1 || st.approvals["acme/i-1"].State != kvstore.ApprovalPending ||
					st.records["i-1"].Status != api.StatusPendingApproval || inv.Authz != nil {
					t.Fatalf("not parked: status %s, %d outputs, approval %+v", inv.Status, len(outs), st.approvals["acme/i-1"])
				}
				if got := st.usage["acme/token:tok-1"].Calls; got != c.calls {
					t.Fatalf("a parked call was charged: %d calls, want %d", got, c.calls)
				}
				return
			}
			if !c.admitted || inv.Authz == nil || !inv.Authz.Reserved || inv.Authz.ApprovedBy != c.approver || inv.Parked() {
				t.Fatalf("authz %+v, status %s", inv.Authz, inv.Status)
			}
			if inv.Authz.Unmetered != c.unmetered {
				t.Fatalf("unmetered %v, want %v", inv.Authz.Unmetered, c.unmetered)
			}
			if got := st.usage["acme/token:tok-1"].Calls; got != c.calls {
				t.Fatalf("calls charged %d, want %d", got, c.calls)
			}
		})
	}
}

// echoSetup is a signing key, the shipped policy and a registry that holds
// one builtin tool, echo.
func echoSetup(tb testing.TB) (*token.SigningKey, *policy.Engine, *tools.Registry) {
	tb.Helper()
	key, err := token.GenerateSigningKey(token.AlgEdDSA)
	if err != nil {
		tb.Fatal(err)
	}
	engine, err := policy.Default(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	reg := tools.NewRegistry()
	reg.Put(&tools.Manifest{ID: "echo", Version: "1.0.0", Kind: "builtin"})
	return key, engine, reg
}

// The policy input's parts kept between calls (the manifest's, the
// claims') belong to one manifest and one token: another token, or the
// same version registered again, is judged on its own.
func TestPolicyInputPerTokenAndManifest(t *testing.T) {
	ctx := context.Background()
	key, err := token.GenerateSigningKey(token.AlgEdDSA)
	if err != nil {
		t.Fatal(err)
	}
	engine, err := policy.Default(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reg := tools.NewRegistry()
	reg.Put(&tools.Manifest{ID: "wipe", Version: "1.0.0", Kind: "builtin",
		Safety: tools.Safety{RiskLevel: "low", SideEffects: []string{"fs.delete"}}})
	mint := func(id string, excluded ...string) string {
		raw, err := token.Mint(key, token.Claims{ToolID: token.Patterns{"*"}, TenantID: "acme", AgentDID: "did:agent:a",
			ExcludedSideEffects: excluded,
			RegisteredClaims: jwt.RegisteredClaims{ID: id, Issuer: issuer, Audience: jwt.ClaimStrings{audience},
				ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}})
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	free, barred := mint("tok-free"), mint("tok-barred", "fs")
	a := New(Config{Registry: reg, Kinds: kinds.Compiled(), Policy: engine, Store: newFakeStore(),
		Verifier: &token.Verifier{Keys: token.StaticKeys{Set: key.KeySet()}, Issuer: issuer, Audience: audience}})
	call := func(raw string) (*envelope.Invocation, error) {
		inv := &envelope.Invocation{ID: "i-1", Tenant: "acme", Status: api.StatusPending,
			Request: &api.Request{ToolID: "wipe", CapabilityToken: raw,
				AgentContext: api.AgentContext{AgentDID: "did:agent:a", TenantID: "acme"}}}
		_, err := a.Process(ctx, inv)
		return inv, err
	}
	for range 2 {
		if inv, err := call(free); err != nil || inv.Authz == nil {
			t.Fatalf("free token: %v", err)
		}
		var ae *api.Error
		if _, err := call(barred); !errors.As(err, &ae) || ae.ECode != api.EPolicyDenied {
			t.Fatalf("token excluding fs: %v, want %s", err, api.EPolicyDenied)
		}
	}
	reg.Put(&tools.Manifest{ID: "wipe", Version: "1.0.0", Kind: "builtin",
		Safety: tools.Safety{RiskLevel: "critical", SideEffects: []string{"fs.delete"}}})
	// An http tool whose manifest declares no side effect: its kind
	// reaches the network all the same.
	fetch, err := tools.Parse([]byte(`{"id":"fetch","name":"fetch","version":"1.0.0","description":"fetches","kind":"http",
		"http":{"method":"GET","url":"https://api.example.com/x"},"input_schema":{"type":"object"},
		"permissions":{"network":[{"host":"api.example.com"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	reg.Put(fetch)
	if inv, err := call(free); err != nil || !inv.Parked() {
		t.Fatalf("the version registered again as critical was not parked: %v, status %s", err, inv.Status)
	}
}

// TestPolicyReplacedDecidesAtOnce: a decision the live policy keeps for
// calls alike is not the decision of the policy that replaces it: the
// same call is judged by each policy in turn.
func TestPolicyReplacedDecidesAtOnce(t *testing.T) {
	ctx := context.Background()
	key, engine, reg := echoSetup(t)
	closed, err := policy.New(ctx, map[string]string{"closed.rego": "package toolgate.authz\ndecision := {\"allow\": false, \"reasons\": [\"closed\"]}"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := token.Mint(key, token.Claims{ToolID: token.Patterns{"*"}, TenantID: "acme", AgentDID: "did:agent:a",
		RegisteredClaims: jwt.RegisteredClaims{ID: "tok-1", Issuer: issuer, Audience: jwt.ClaimStrings{audience},
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}})
	if err != nil {
		t.Fatal(err)
	}
	a := New(Config{Registry: reg, Kinds: kinds.Compiled(), Policy: engine, Store: newFakeStore(),
		Verifier: &token.Verifier{Keys: token.StaticKeys{Set: key.KeySet()}, Issuer: issuer, Audience: audience}})
	call := func(i int) error {
		inv := &envelope.Invocation{ID: fmt.Sprint("i-", i), Tenant: "acme", Status: api.StatusPending,
			Request: &api.Request{ToolID: "echo", CapabilityToken: raw, Parameters: []byte(`{"text":"hi"}`),
				AgentContext: api.AgentContext{AgentDID: "did:agent:a", TenantID: "acme"}}}
		_, err := a.Process(ctx, inv)
		return err
	}
	for i, e := range []*policy.Engine{engine, engine, closed, closed, engine} {
		a.SetPolicy(e)
		err := call(i)
		var ae *api.Error
		switch {
		case e == engine && err != nil:
			t.Fatalf("call %d under the shipped policy: %v", i, err)
		case e == closed && (!errors.As(err, &ae) || ae.ECode != api.EPolicyDenied):
			t.Fatalf("call %d under the closed policy: %v, want %s", i, err, api.EPolicyDenied)
		}
	}
}

// policyInputs are inputs with every part set, and with few.
func policyInputs() map[string]Input {
	claims := &token.Claims{ToolID: token.Patterns{"fs.*"}, TenantID: "acme", AgentDID: "did:a",
		Budget:     &token.Budget{MaxCalls: 5, ApprovalAfterFailures: 2},
		Filesystem: &token.FilesystemGrant{AllowedPaths: []string{"/data"}, Mode: "rw"},
		Network:    &token.NetworkGrant{AllowedHosts: []string{"*.example.com"}, AllowedPorts: []int{443}}}
	manifest := &tools.Manifest{ID: "fs.read", Version: "1.2.0", Kind: "builtin", Cost: &tools.Cost{PerCall: 0.5},
		Safety: tools.Safety{RiskLevel: "high", SideEffects: []string{"fs.read"}}}
	req := &api.Request{ToolID: "fs.read", Parameters: []byte(`{"path":"/data/x","n":[1,2.5,null],"deep":{"a":true}}`),
		AgentContext:     api.AgentContext{AgentDID: "did:a", TenantID: "acme", SessionID: "s"},
		ExecutionOptions: &api.ExecutionOptions{Priority: "high", RequireApproval: true}}
	return map[string]Input{
		"empty": {},
		"unmetered call": {Request: req, Tool: manifest, Claims: claims, Tenant: "acme", Time: "2026-01-01T00:00:00Z",
			Resources: Resources{Paths: []PathNeed{}, Hosts: []HostNeed{}, Credentials: []string{}},
			Derived:   Derived{HostGranted: map[string]bool{}}},
		"everything": {Request: req, Tool: manifest, Claims: claims, Tenant: "acme", Time: "2026-01-01T00:00:00Z",
			Usage: kvstore.Usage{Calls: 3, RuntimeMS: 40, Cost: 1.5, Tokens: 7, ConsecutiveFailures: 2, Reserved: []string{"i-1"},
				UpdatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)},
			Resources: Resources{Paths: []PathNeed{{Path: "/data/x", Mode: "ro"}, {Path: "/tmp", Mode: "rw"}},
				Hosts: []HostNeed{{Host: "api.example.com", Port: 443}, {Host: "x.org"}}, Credentials: []string{"k1", "k2"}},
			Derived:  Derived{PreApproved: true, HostGranted: map[string]bool{"api.example.com": true, "x.org": false}},
			Approval: &ApprovalInput{State: "approved", DecidedBy: "alice"}},
		"approval pending": {Request: req, Claims: claims, Approval: &ApprovalInput{State: "pending"}},
		"metered call, usage as judged": {Request: req, Tool: manifest, Claims: claims, Tenant: "acme",
			Usage: kvstore.Usage{Calls: 1 << 40, Cost: 0.1 + 0.2, Tokens: 12, ConsecutiveFailures: 1,
				UpdatedAt: time.Date(2026, 1, 1, 0, 0, 0, 123456789, time.UTC),
				StartedAt: time.Date(2025, 12, 31, 23, 0, 0, 0, time.FixedZone("x", 3600)),
				Aborted:   &kvstore.Abort{InvocationID: "i-9", Hook: "stop", At: time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC)}}},
		"metered call, tiny cost": {Request: req, Claims: claims, Usage: kvstore.Usage{Calls: 2, Cost: 1e-21}},
	}
}

// TestPolicyInputIsItsJSON: the input handed to OPA, built from parts,
// is the value of Input's JSON encoding, whatever is set in it.
func TestPolicyInputIsItsJSON(t *testing.T) {
	inputs := policyInputs()
	for name, in := range inputs {
		t.Run(name, func(t *testing.T) {
			want, err := astValue(in)
			if err != nil {
				t.Fatal(err)
			}
			a := &Authorizer{}
			for _, raw := range []string{"raw-token", "raw-token", ""} { // cached, then from the cache, then a linked call
				got, err := a.policyInput(in, raw, allParts)
				if err != nil {
					t.Fatal(err)
				}
				if ast.Compare(got, want) != 0 {
					t.Fatalf("token %q:\n got %v\nwant %v", raw, got, want)
				}
			}
		})
	}
}

// TestManifestFormsLiveWithTheManifest: a manifest is converted once for
// as long as it lives, however many others are cached beside it, and its
// form goes when the manifest does.
func TestManifestFormsLiveWithTheManifest(t *testing.T) {
	var c manifestForms
	kept := &tools.Manifest{ID: "kept", Version: "1.0.0"}
	first, err := c.value(kept)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2000 {
		if _, err := c.value(&tools.Manifest{ID: fmt.Sprintf("other%d", i), Version: "1.0.0"}); err != nil {
			t.Fatal(err)
		}
	}
	if again, _ := c.value(kept); again != first {
		t.Fatal("a live manifest was converted again")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		c.mu.Lock()
		n := len(c.m)
		c.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d forms kept after their manifests were collected, want 1", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	runtime.KeepAlive(kept)
}

// TestKindsFailClosed: what a call needs beyond its manifest comes from
// its kind (the host an http.get URL names). A stage given no kinds, or
// kinds without the tool's, refuses the call rather than judge it on the
// manifest alone, where the named host would go unchecked.
func TestKindsFailClosed(t *testing.T) {
	ctx := context.Background()
	key, engine, reg := echoSetup(t)
	get, err := tools.Parse([]byte(`{"id":"http.get","name":"get","version":"1.0.0","description":"gets","kind":"http",
		"http":{"url":"{{url}}"},"input_schema":{"type":"object"}}`))
	if err != nil {
		t.Fatal(err)
	}
	reg.Put(get)
	raw, err := token.Mint(key, token.Claims{ToolID: token.Patterns{"*"}, TenantID: "acme", AgentDID: "did:agent:a",
		Network: &token.NetworkGrant{AllowedHosts: []string{"api.example.com"}},
		RegisteredClaims: jwt.RegisteredClaims{ID: "tok-1", Issuer: issuer, Audience: jwt.ClaimStrings{audience},
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		kinds     *kind.Registry
		url       string
		wantECode string
	}{
		{name: "granted host", kinds: kinds.Compiled(), url: "https://api.example.com/x"},
		{name: "host the token does not grant", kinds: kinds.Compiled(), url: "https://evil.example.net/x", wantECode: api.ENetworkDenied},
		{name: "no kinds", url: "https://evil.example.net/x", wantECode: api.EExecutorUnavailable},
		{name: "kinds without http", kinds: kind.NewRegistry(kinds.Builtin), url: "https://api.example.com/x", wantECode: api.EExecutorUnavailable},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := New(Config{Registry: reg, Kinds: c.kinds, Policy: engine, Store: newFakeStore(),
				Verifier: &token.Verifier{Keys: token.StaticKeys{Set: key.KeySet()}, Issuer: issuer, Audience: audience}})
			inv := &envelope.Invocation{ID: "i-1", Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: 3},
				Request: &api.Request{ToolID: "http.get", CapabilityToken: raw, Parameters: []byte(`{"url":"` + c.url + `"}`),
					AgentContext: api.AgentContext{AgentDID: "did:agent:a", TenantID: "acme"}}}
			_, err := a.Process(ctx, inv)
			if c.wantECode == "" {
				if err != nil || inv.Authz == nil {
					t.Fatalf("not admitted: %v", err)
				}
				return
			}
			var ae *api.Error
			if !errors.As(err, &ae) || ae.ECode != c.wantECode || inv.Authz != nil {
				t.Fatalf("err %v (authz %+v), want %s and no authorization", err, inv.Authz, c.wantECode)
			}
		})
	}
}

// TestRequestTermIsItsJSON: the request's policy form, built directly, is
// its JSON encoding's, with every field of api.Request set (one added to
// it and not to requestTerm fails here), and with each left out.
func TestRequestTermIsItsJSON(t *testing.T) {
	full := &api.Request{}
	fill(reflect.ValueOf(full).Elem())
	reqs := map[string]*api.Request{"every field": full, "nil": nil}
	for f := range reflect.TypeFor[api.Request]().Fields() {
		r := *full
		reflect.ValueOf(&r).Elem().FieldByIndex(f.Index).SetZero()
		reqs["without "+f.Name] = &r
	}
	for name, r := range reqs {
		want, err := astValue(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := requestTerm(r, allParts)
		if err != nil {
			t.Fatal(err)
		}
		if ast.Compare(got.Value, want) != 0 {
			t.Errorf("%s:\n got %v\nwant %v", name, got, want)
		}
	}
}

// fill sets every field v holds, nested ones too, to a value that is not
// its zero.
func fill(v reflect.Value) {
	switch {
	case v.Type() == reflect.TypeFor[json.RawMessage]():
		v.SetBytes([]byte(`{"path": "/a<b>", "n": [1, 2.50, null], "deep": {"ok": true}}`))
		return
	case v.Type() == reflect.TypeFor[time.Time]():
		v.Set(reflect.ValueOf(time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString("x-" + v.Type().Name())
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem())
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(v.Index(0))
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k)
		fill(e)
		v.SetMapIndex(k, e)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i))
			}
		}
	case reflect.Interface:
		v.Set(reflect.ValueOf("x"))
	}
}

// TestInputLeavesOutWhatNoPolicyReads: the input leaves out the parts
// neither the live policy nor the shadow reads (the shipped policy reads
// no request member but the agent context and the execution options, nor
// the time, nor the usage's times), and the decision on it is the one on
// the whole input; a shadow that reads them has them back.
func TestInputLeavesOutWhatNoPolicyReads(t *testing.T) {
	ctx := context.Background()
	e, err := policy.Default(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := &Authorizer{}
	a.SetPolicy(e)
	parts := a.readsOf(e, nil).parts
	for i, name := range requestMembers {
		if read := name == "agent_context" || name == "execution_options"; (parts&requestPart(i) != 0) != read {
			t.Errorf("request member %s in the input: %v, want %v", name, !read, read)
		}
	}
	if parts&(partTime|partUsageTimes) != 0 {
		t.Errorf("parts %b: the time or the usage's times kept", parts)
	}
	for name, in := range policyInputs() {
		in.Usage.UpdatedAt = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		pruned, err := a.policyInput(in, "raw-token", parts)
		if err != nil {
			t.Fatal(err)
		}
		whole, err := astValue(in)
		if err != nil {
			t.Fatal(err)
		}
		if ast.Compare(pruned, whole) == 0 {
			t.Errorf("%s: nothing left out", name)
		}
		got, err1 := e.Eval(ctx, pruned)
		want, err2 := e.Eval(ctx, in) // plain Go: evaluated whole, not from the memo
		if (err1 != nil) != (err2 != nil) || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: decided %+v (%v) on the input, %+v (%v) on the whole", name, got, err1, want, err2)
		}
	}
	sh, err := policy.New(ctx, map[string]string{"p.rego": `package toolgate.authz
decision := {"allow": count(input.request) > 0, "reasons": [input.time, sprintf("%v", [input.usage.updated_at])]}`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.SetShadow(sh, 2)
	if got := a.readsOf(e, a.shadow.Load()).parts; got != allParts {
		t.Errorf("with a shadow reading them, parts %b, want %b", got, allParts)
	}
}

// BenchmarkPolicyInput is a call's policy input with every part but the
// parameters (as every part was built while only the parameters were left
// out unread), and without the parts the shipped policy does not read.
func BenchmarkPolicyInput(b *testing.B) {
	e, err := policy.Default(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	a := &Authorizer{}
	in := policyInputs()["unmetered call"]
	in.Request.CapabilityToken = "eyJhbGciOiJFZERTQSJ9." + strings.Repeat("x", 300) + ".c2lnbmF0dXJl"
	in.Usage = kvstore.Usage{Calls: 3, UpdatedAt: time.Now(), StartedAt: time.Now()}
	for name, parts := range map[string]inputPart{"all but the parameters": allParts &^ requestPart(4), "read": a.readsOf(e, nil).parts} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := a.policyInput(in, "raw-token", parts); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
