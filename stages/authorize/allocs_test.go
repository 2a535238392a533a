package authorize

import (
	"context"
	"crypto/ed25519"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/allocbudget"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/stages/execute/kinds"
)

// allocBudgets are Process's allocations per call, recorded: a change that
// allocates more than 20 % over one fails TestAllocationBudget.
var allocBudgets = map[string]float64{
	// One admitted call of a session's token, no budget: what every
	// invocation pays in authorize (its decision read back from the
	// policy's memo, as every call of a tool with one token and no usage).
	"admitted": 42,
	// The same call on an authenticated bus: sealed for execute, and its
	// principal signed for audit.
	"sealed": 54,
}

func allocPaths(tb testing.TB) map[string]func() {
	tb.Helper()
	ctx := context.Background()
	key, engine, reg := echoSetup(tb)
	raw, err := token.Mint(key, token.Claims{ToolID: token.Patterns{"*"}, TenantID: "acme", AgentDID: "did:agent:a",
		RegisteredClaims: jwt.RegisteredClaims{ID: "tok-1", Issuer: issuer, Audience: jwt.ClaimStrings{audience},
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}})
	if err != nil {
		tb.Fatal(err)
	}
	a := New(Config{Registry: reg, Kinds: kinds.Compiled(), Policy: engine, Store: newFakeStore(),
		Verifier: &token.Verifier{Keys: token.StaticKeys{Set: key.KeySet()}, Issuer: issuer, Audience: audience}})
	_, sealKey, _ := ed25519.GenerateKey(nil)
	_, hopKey, _ := ed25519.GenerateKey(nil)
	signer := seal.NewSigner(busauth.RoleAuthorize, hopKey)
	sealed := New(Config{Registry: reg, Kinds: kinds.Compiled(), Policy: engine, Store: newFakeStore(),
		Verifier:      &token.Verifier{Keys: token.StaticKeys{Set: key.KeySet()}, Issuer: issuer, Audience: audience},
		Sealer:        seal.NewSealer(sealKey),
		SignPrincipal: func(text []byte) string { return signer.SignRecord("principal", text) }})
	call := func(a *Authorizer) func() {
		return func() {
			inv := &envelope.Invocation{ID: "i-1", Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: 3},
				Request: &api.Request{ToolID: "echo", CapabilityToken: raw, Parameters: []byte(`{"text":"hi"}`),
					AgentContext: api.AgentContext{AgentDID: "did:agent:a", TenantID: "acme"}}}
			if _, err := a.Process(ctx, inv); err != nil || inv.Authz == nil {
				tb.Fatal(err)
			}
		}
	}
	return map[string]func(){"admitted": call(a), "sealed": call(sealed)}
}

func TestAllocationBudget(t *testing.T) { allocbudget.Check(t, allocBudgets, allocPaths(t)) }

// BenchmarkProcess is the stage's work per call, with its allocations.
func BenchmarkProcess(b *testing.B) { allocbudget.Bench(b, allocPaths(b)) }
