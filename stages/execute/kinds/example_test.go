package kinds_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages/authorize"
	"github.com/toolgate/toolgate/stages/execute"
	"github.com/toolgate/toolgate/stages/execute/builtin"
	"github.com/toolgate/toolgate/stages/execute/kind"
	"github.com/toolgate/toolgate/stages/execute/kinds"
	"github.com/toolgate/toolgate/stages/route"
)

// echo is a whole tool kind, what its own folder (stages/execute/echotool)
// would hold: a tool of kind echo returns its call's parameters, and a
// call that names a "via" host needs that host granted by the token.
var echo = kind.Kind{
	Name: "echo",
	New:  func(*kind.Deps) (kind.Runner, error) { return echoRunner{}, nil },
	Resources: func(_ *tools.Manifest, params json.RawMessage) (kind.Resources, error) {
		var p struct {
			Via string `json:"via"`
		}
		if json.Unmarshal(params, &p) != nil || p.Via == "" {
			return kind.Resources{}, nil
		}
		return kind.Resources{Hosts: []kind.Host{{Host: p.Via}}}, nil
	},
}

type echoRunner struct{}

func (echoRunner) Prepare(*tools.Manifest, *envelope.Invocation) (kind.Func, error) {
	return func(_ context.Context, params json.RawMessage) (json.RawMessage, error) {
		return json.Marshal(map[string]json.RawMessage{"echo": params})
	}, nil
}

// TestAddAKind: the echo kind registered with one line runs through
// authorize, route and execute, each given the same registry, over a real
// JetStream store and the shipped policy. Without the line, each of them
// refuses an echo tool.
func TestAddAKind(t *testing.T) {
	ctx := context.Background()
	withEcho, err := kinds.Compiled().With(echo) // the one line
	if err != nil {
		t.Fatal(err)
	}
	reg := tools.NewRegistry()
	say := &tools.Manifest{ID: "say", Version: "1.0.0", Kind: "echo"}
	reg.Put(say)

	js, err := jetstream.New(natstest.Connect(t, natstest.Server(t).ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	store, err := kvstore.Open(ctx, js, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	engine, err := policy.Default(ctx)
	if err != nil {
		t.Fatal(err)
	}
	key, err := token.GenerateSigningKey(token.AlgEdDSA)
	if err != nil {
		t.Fatal(err)
	}
	const issuer, audience = "urn:test:issuer", "urn:test:toolgate"
	raw, err := token.Mint(key, token.Claims{ToolID: token.Patterns{"say"}, TenantID: "acme", AgentDID: "did:agent:a",
		Network: &token.NetworkGrant{AllowedHosts: []string{"relay.example.com"}},
		RegisteredClaims: jwt.RegisteredClaims{ID: "tok-1", Issuer: issuer, Audience: jwt.ClaimStrings{audience},
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}})
	if err != nil {
		t.Fatal(err)
	}
	authorizer := func(k *kind.Registry) *authorize.Authorizer {
		return authorize.New(authorize.Config{Registry: reg, Kinds: k, Policy: engine, Store: store,
			Verifier: &token.Verifier{Keys: token.StaticKeys{Set: key.KeySet()}, Issuer: issuer, Audience: audience}})
	}
	x := execute.New(reg, builtin.New(builtin.Env{}), store, nil)
	if err := x.Install(withEcho, &kind.Deps{}); err != nil {
		t.Fatal(err)
	}
	call := func(id, params string) *envelope.Invocation {
		return &envelope.Invocation{ID: id, Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: 7},
			Request: &api.Request{ToolID: "say", CapabilityToken: raw, Parameters: json.RawMessage(params),
				AgentContext: api.AgentContext{AgentDID: "did:agent:a", TenantID: "acme"}}}
	}
	refused := func(t *testing.T, err error, ecode string) {
		t.Helper()
		var ae *api.Error
		if !errors.As(err, &ae) || ae.ECode != ecode {
			t.Fatalf("err %v, want %s", err, ecode)
		}
	}

	t.Run("runs", func(t *testing.T) {
		inv := call("i-1", `{"text":"hi","via":"relay.example.com"}`)
		if _, err := authorizer(withEcho).Process(ctx, inv); err != nil || inv.Authz == nil {
			t.Fatalf("authorize: %v", err)
		}
		if _, err := route.New(reg, withEcho.Names()...).Process(ctx, inv); err != nil || inv.Route == nil {
			t.Fatalf("route: %v", err)
		}
		if _, err := x.Process(ctx, inv); err != nil {
			t.Fatalf("execute: %v", err)
		}
		if want := `{"echo":{"text":"hi","via":"relay.example.com"}}`; string(inv.Result) != want {
			t.Fatalf("result %s, want %s", inv.Result, want)
		}
	})
	t.Run("its resources are held to the token", func(t *testing.T) {
		inv := call("i-2", `{"text":"hi","via":"elsewhere.example.net"}`)
		_, err := authorizer(withEcho).Process(ctx, inv)
		refused(t, err, api.ENetworkDenied)
	})
	t.Run("without the line it is refused everywhere", func(t *testing.T) {
		compiled := kinds.Compiled()
		_, err := authorizer(compiled).Process(ctx, call("i-3", `{"text":"hi"}`))
		refused(t, err, api.EExecutorUnavailable)
		_, err = route.New(reg, compiled.Names()...).Process(ctx, call("i-4", `{"text":"hi"}`))
		refused(t, err, api.EExecutorUnavailable)
		refused(t, compiled.Check(say), api.EInvalidManifest)
		if err := withEcho.Check(say); err != nil {
			t.Fatalf("with the line: %v", err)
		}
		bare := execute.New(reg, builtin.New(builtin.Env{}), store, nil)
		if err := bare.Install(compiled, &kind.Deps{}); err != nil {
			t.Fatal(err)
		}
		inv := call("i-5", `{"text":"hi"}`)
		inv.Route = &envelope.Route{ToolID: "say", ToolVersion: "1.0.0", Executor: "echo"}
		_, err = bare.Process(ctx, inv)
		refused(t, err, api.EExecutorUnavailable)
	})
}
