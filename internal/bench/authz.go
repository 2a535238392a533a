package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/ratelimit"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

const (
	benchIssuer   = "toolgate-bench"
	benchAudience = "toolgate"
)

// credentials are the signing key and token the benchmark's agent uses.
type credentials struct {
	verifier *token.Verifier
	token    string
	key      *token.SigningKey
}

// tokenFor mints a token granting every tool to benchAgent of tenant.
func (c credentials) tokenFor(tenant string) (string, error) {
	return token.Mint(c.key, token.Claims{
		ToolID: token.Patterns{"*"}, TenantID: tenant, AgentDID: benchAgent,
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer: benchIssuer, Audience: jwt.ClaimStrings{benchAudience},
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour)),
		},
	})
}

func newCredentials() (credentials, error) {
	k, err := token.GenerateSigningKey(token.AlgEdDSA)
	if err != nil {
		return credentials{}, err
	}
	raw, err := token.Mint(k, token.Claims{
		ToolID: token.Patterns{"*"}, TenantID: benchTenant, AgentDID: benchAgent,
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer: benchIssuer, Audience: jwt.ClaimStrings{benchAudience},
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour)),
		},
	})
	if err != nil {
		return credentials{}, err
	}
	v := &token.Verifier{Keys: token.StaticKeys{Set: k.KeySet()}, Issuer: benchIssuer, Audience: benchAudience}
	return credentials{verifier: v, token: raw, key: k}, nil
}

// Cost is one measured step: its name and sorted samples.
type Cost struct {
	Name    string
	Samples []time.Duration // sorted
}

func (a Cost) quantile(q float64) time.Duration {
	return Result{Latencies: a.Samples}.Quantile(q)
}

const authzSamples = 2000

// measureAuthz times, on a running node, the authorize stage's logic for
// one invocation (token verification, policy evaluation, the usage and
// approval reads and the budget compare-and-swap), its token verification
// alone, and as the raw baseline one KV read plus one compare-and-swap.
func measureAuthz(ctx context.Context, n *node.Node, cred credentials) ([]Cost, error) {
	st, err := n.NewStage(ctx, subjects.Authorize, node.StageConfig{Tokens: cred.verifier})
	if err != nil {
		return nil, err
	}
	req := api.Request{ToolID: "noop", Parameters: json.RawMessage(`{}`), CapabilityToken: cred.token,
		AgentContext: api.AgentContext{AgentDID: benchAgent, TenantID: benchTenant, SessionID: "authz-bench"}}
	timeIt := func(name string, fn func(i int) error) (Cost, error) {
		out := Cost{Name: name, Samples: make([]time.Duration, 0, authzSamples)}
		for i := range authzSamples + warmup {
			start := time.Now()
			if err := fn(i); err != nil {
				return out, fmt.Errorf("%s: %w", name, err)
			}
			if i >= warmup {
				out.Samples = append(out.Samples, time.Since(start))
			}
		}
		slices.Sort(out.Samples)
		return out, nil
	}
	stage, err := timeIt("authorize, no budget", func(i int) error {
		r := req
		inv := &envelope.Invocation{ID: fmt.Sprintf("authz-%d", i), Tenant: benchTenant, Request: &r,
			Event: envelope.Event{Seq: uint64(i + 1)}}
		_, err := st.Process(ctx, inv)
		return err
	})
	if err != nil {
		return nil, err
	}
	budgetTok, err := token.Mint(cred.key, token.Claims{
		ToolID: token.Patterns{"*"}, TenantID: benchTenant, AgentDID: benchAgent,
		Budget: &token.Budget{MaxCalls: 1 << 40},
		RegisteredClaims: jwt.RegisteredClaims{
			ID: "authz-bench-budget", Issuer: benchIssuer, Audience: jwt.ClaimStrings{benchAudience},
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour)),
		},
	})
	if err != nil {
		return nil, err
	}
	budgeted, err := timeIt("authorize, budget token", func(i int) error {
		r := req
		r.CapabilityToken = budgetTok
		inv := &envelope.Invocation{ID: fmt.Sprintf("authz-b-%d", i), Tenant: benchTenant, Request: &r,
			Event: envelope.Event{Seq: uint64(i + 1)}}
		_, err := st.Process(ctx, inv)
		return err
	})
	if err != nil {
		return nil, err
	}
	// A verifier remembers the tokens that verified: the first sight of a
	// token is the parse and the signature check, every later one a lookup.
	verify, err := timeIt("token verification", func(int) error {
		v := &token.Verifier{Keys: cred.verifier.Keys, Issuer: cred.verifier.Issuer, Audience: cred.verifier.Audience}
		_, err := v.Verify(cred.token)
		return err
	})
	if err != nil {
		return nil, err
	}
	again, err := timeIt("token seen again", func(int) error {
		_, err := cred.verifier.Verify(cred.token)
		return err
	})
	if err != nil {
		return nil, err
	}
	kv, err := timeIt("raw: KV read + CAS", func(int) error {
		_, err := n.Store.UpdateUsage(ctx, benchTenant, "raw-bench", func(u *kvstore.Usage) error { u.Calls++; return nil })
		return err
	})
	if err != nil {
		return nil, err
	}
	limited := &tools.Manifest{ID: "bench.limited", RateLimit: &tools.RateLimit{Requests: 1_000_000, PerSeconds: 1}}
	leased := ratelimit.New(n.Store, ratelimit.DefaultMaxLease)
	lease, err := timeIt("rate limit, leased", func(int) error {
		_, _, err := leased.Allow(ctx, benchTenant, "", limited)
		return err
	})
	if err != nil {
		return nil, err
	}
	single := ratelimit.New(n.Store, 1)
	each, err := timeIt("rate limit, CAS per call", func(int) error {
		_, _, err := single.Allow(ctx, benchTenant+"-single", "", limited)
		return err
	})
	if err != nil {
		return nil, err
	}
	return []Cost{stage, verify, kv, lease, each, budgeted, again}, nil
}

func printAuthz(w io.Writer, costs []Cost) {
	fmt.Fprintf(w, "\nauthorization and rate limiting per invocation (%d sequential calls, EdDSA token, shipped policy):\n", authzSamples)
	fmt.Fprintf(w, "%-26s %9s %9s %9s\n", "step", "p50", "p99", "max")
	for _, c := range costs {
		fmt.Fprintf(w, "%-26s %9s %9s %9s\n", c.Name, us(c.quantile(0.5)), us(c.quantile(0.99)), us(c.quantile(1)))
	}
	for _, c := range costs {
		if strings.HasPrefix(c.Name, "authorize") {
			ok := "met"
			if c.quantile(0.5) > 100*time.Microsecond {
				ok = "NOT MET"
			}
			fmt.Fprintf(w, "goal: %s p50 <= 100µs: %s (%s)\n", c.Name, ok, us(c.quantile(0.5)))
		}
	}
	if len(costs) >= 3 && costs[2].quantile(0.5) > 0 {
		fmt.Fprintf(w, "%-26s %9.2f %9.2f\n", "ratio stage/raw KV", float64(costs[0].quantile(0.5))/float64(costs[2].quantile(0.5)),
			float64(costs[0].quantile(0.99))/float64(costs[2].quantile(0.99)))
	}
}

func us(d time.Duration) string { return fmt.Sprintf("%.1fµs", float64(d.Nanoseconds())/1000) }
