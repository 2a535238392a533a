package authorize

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages/execute/kinds"
)

// agrees is a candidate that decides as the shipped policy on every call
// the tests make.
const agrees = `package toolgate.authz

deny contains {"msg": "never", "code": "E3209"} if input.tool.id == "no.such.tool"
`

const echoOff = `package toolgate.authz

deny contains {"msg": "echo is switched off", "code": "E3209"} if input.tool.id == "echo"
`

// shadowSetup is an authorizer with the shipped policy live and a token
// for acme; candidate, when set, is evaluated in shadow.
func shadowSetup(tb testing.TB, candidate string, seen *[]api.ShadowDivergence) (*Authorizer, func(id string) *envelope.Invocation) {
	tb.Helper()
	key, engine, reg := echoSetup(tb)
	raw, err := token.Mint(key, token.Claims{ToolID: token.Patterns{"*"}, TenantID: "acme", AgentDID: "did:agent:a",
		RegisteredClaims: jwt.RegisteredClaims{ID: "tok-1", Issuer: issuer, Audience: jwt.ClaimStrings{audience},
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}})
	if err != nil {
		tb.Fatal(err)
	}
	cfg := Config{Registry: reg, Kinds: kinds.Compiled(), Policy: engine, Store: newFakeStore(),
		Verifier: &token.Verifier{Keys: token.StaticKeys{Set: key.KeySet()}, Issuer: issuer, Audience: audience}}
	if seen != nil {
		cfg.OnShadowDiverged = func(d api.ShadowDivergence) { *seen = append(*seen, d) }
	}
	a := New(cfg)
	if candidate != "" {
		cand, err := policy.New(context.Background(), map[string]string{"authz.rego": policy.DefaultModule(), "c.rego": candidate}, nil)
		if err != nil {
			tb.Fatal(err)
		}
		a.SetShadow(cand, 7)
	}
	return a, func(id string) *envelope.Invocation {
		return &envelope.Invocation{ID: id, Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: 3},
			Request: &api.Request{ToolID: "echo", CapabilityToken: raw, Parameters: []byte(`{"text":"hi"}`),
				AgentContext: api.AgentContext{AgentDID: "did:agent:a", TenantID: "acme"}}}
	}
}

// TestShadowNeverEnforced: a candidate that denies what the live policy
// allows changes no outcome and reports each call with both decisions; one
// that agrees reports nothing.
func TestShadowNeverEnforced(t *testing.T) {
	var seen []api.ShadowDivergence
	a, call := shadowSetup(t, echoOff, &seen)
	inv := call("i-1")
	if _, err := a.Process(context.Background(), inv); err != nil || inv.Authz == nil {
		t.Fatalf("with a denying candidate: %v, want the call admitted", err)
	}
	if len(seen) != 1 || !seen[0].Live.Allow || seen[0].Candidate.Allow || seen[0].Candidate.Code != api.EPolicyDenied ||
		seen[0].Rule != "echo is switched off" || seen[0].CandidateRevision != 7 || seen[0].InvocationID != "i-1" {
		t.Fatalf("divergences %+v", seen)
	}
	a.SetShadow(nil, 0)
	if _, err := a.Process(context.Background(), call("i-2")); err != nil || len(seen) != 1 {
		t.Fatalf("after the drop: %v, %d divergences", err, len(seen))
	}
	seen = nil
	b, call := shadowSetup(t, `package toolgate.authz
deny contains {"msg": "never", "code": "E3209"} if input.tool.id == "no.such.tool"
`, &seen)
	if _, err := b.Process(context.Background(), call("i-3")); err != nil || len(seen) != 0 {
		t.Fatalf("an agreeing candidate: %v, %+v", err, seen)
	}
}

// TestParametersForTheShadowAlone: the live policy does not read the
// parameters, so its input goes without them, but a candidate that reads
// them is given them, and a call whose parameters it refuses diverges.
func TestParametersForTheShadowAlone(t *testing.T) {
	var seen []api.ShadowDivergence
	a, call := shadowSetup(t, `package toolgate.authz
deny contains {"msg": "echo may not say secret", "code": "E3209"} if input.request.parameters.text == "secret"
`, &seen)
	if a.engine.Load().Reads("request", "parameters") {
		t.Fatal("the shipped policy reads the parameters: this test shows nothing")
	}
	for i, text := range []string{"hi", "secret", "hi", "secret"} {
		inv := call(fmt.Sprint("i-", i))
		inv.Request.Parameters = []byte(`{"text":"` + text + `"}`)
		if _, err := a.Process(context.Background(), inv); err != nil || inv.Authz == nil {
			t.Fatalf("call %d: %v, want it admitted", i, err)
		}
	}
	if len(seen) != 2 || seen[0].InvocationID != "i-1" || seen[1].InvocationID != "i-3" || seen[0].Rule != "echo may not say secret" {
		t.Fatalf("divergences %+v, want i-1 and i-3's", seen)
	}
}

// BenchmarkShadow is authorize's work per admitted call without a
// candidate, with one that agrees and with one that disagrees (the event
// is built; outside a runner it is not sent), with each call's p50 and p99.
func BenchmarkShadow(b *testing.B) {
	for _, c := range []struct{ name, candidate string }{
		{"live-only", ""},
		{"shadow-agrees", agrees},
		{"shadow-diverges", echoOff},
	} {
		b.Run(c.name, func(b *testing.B) {
			a, call := shadowSetup(b, c.candidate, nil)
			ctx := context.Background()
			took := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				inv := call("i-1")
				start := time.Now()
				if _, err := a.Process(ctx, inv); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(took[len(took)*99/100].Nanoseconds())/1e3, "p99-µs")
		})
	}
	// The live policy's own evaluation on the same input: what the
	// candidate's may add at most (docs/authorization.md).
	for _, c := range []struct{ name, candidate string }{{"live-eval-alone", ""}, {"agreeing-candidate-eval-alone", agrees}, {"denying-candidate-eval-alone", echoOff}} {
		b.Run(c.name, func(b *testing.B) { benchEvalAlone(b, c.candidate) })
	}
}

// benchEvalAlone times one policy evaluation on a call's input: the live
// policy's, or with candidate the candidate's.
func benchEvalAlone(b *testing.B, candidate string) {
	{
		a, call := shadowSetup(b, candidate, nil)
		inv := call("i-1")
		m, err := a.cfg.Registry.Resolve("echo", "")
		if err != nil {
			b.Fatal(err)
		}
		claims, err := a.cfg.Verifier.Verify(inv.Request.CapabilityToken)
		if err != nil {
			b.Fatal(err)
		}
		in := Input{Request: redactToken(inv.Request), Tool: m, Claims: cleanGrants(claims), Resources: mustResources(b, m, inv.Request.Parameters),
			Tenant: "acme", Time: time.Now().UTC().Format(time.RFC3339)}
		in.Derived = derive(claims, m, in.Resources)
		_, input, _, err := a.evalInput(context.Background(), in, inv.Request.CapabilityToken)
		if err != nil {
			b.Fatal(err)
		}
		engine := a.engine.Load()
		if sh := a.shadow.Load(); sh != nil {
			engine = sh.engine
		}
		took := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			if _, err := engine.Eval(context.Background(), input); err != nil {
				b.Fatal(err)
			}
			took = append(took, time.Since(start))
		}
		b.StopTimer()
		slices.Sort(took)
		b.ReportMetric(float64(took[len(took)/2].Nanoseconds())/1e3, "p50-µs")
		b.ReportMetric(float64(took[len(took)*99/100].Nanoseconds())/1e3, "p99-µs")
	}
}

func mustResources(tb testing.TB, m *tools.Manifest, params json.RawMessage) Resources {
	tb.Helper()
	r, err := resources(kinds.Compiled(), m, params)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}
