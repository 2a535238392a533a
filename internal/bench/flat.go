package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/subjects"
)

// flatMany is how many tools and tenants the flatness series spread their
// calls over in make bench; flatRuns is how many rounds measure each series,
// keeping its best (the machine's noise only ever slows one). A round runs
// every series once, so that a drift of the machine over the run weighs on
// the baseline as on the others.
const (
	flatMany = 10000
	flatRuns = 3
)

// Flatness is the per-invocation cost with many tools or tenants beside
// the same with few: each the saturation of the no-op pipeline.
type Flatness struct {
	Name       string
	Base, Many Result
}

// Ratio is the cost with many over the cost with few (saturation few over
// saturation many): 1 is flat, 1.2 is 20 % dearer.
func (f Flatness) Ratio() float64 { return f.Base.Throughput() / max(f.Many.Throughput(), 1e-9) }

// measureFlatness saturates the pipeline with one tenant calling noop (the
// example tools registered, about ten), then with the calls spread over
// many tenants, then, after registering many more no-op tools, over
// all of them; the copies are removed again before the next round.
func measureFlatness(ctx context.Context, nc *nats.Conn, n *node.Node, o Options, cred credentials, many int) ([]Flatness, error) {
	count := o.SaturationN
	if count <= 0 {
		count = saturationN
	}
	const publishers = 64
	keepBest := func(out *Result, t *target, name string) error {
		r, err := t.saturate(ctx, name, count, publishers)
		if err != nil {
			return err
		}
		if r.Throughput() > out.Throughput() || out.Done == 0 {
			*out = r
		}
		out.Name = name
		return nil
	}
	base, stopBase, err := spreadTarget(nc, cred, 1, []string{"noop"})
	if err != nil {
		return nil, err
	}
	defer stopBase()
	tenants, stopTenants, err := spreadTarget(nc, cred, many, []string{"noop"})
	if err != nil {
		return nil, err
	}
	defer stopTenants()
	ids := make([]string, many)
	for i := range ids {
		ids[i] = fmt.Sprintf("flat.noop%05d", i)
	}
	spread, stopSpread, err := spreadTarget(nc, cred, 1, ids)
	if err != nil {
		return nil, err
	}
	defer stopSpread()
	var few, manyTenants, manyTools Result
	for range flatRuns {
		if err := keepBest(&few, base, "1 tenant, noop, ~10 tools"); err != nil {
			return nil, err
		}
		if err := keepBest(&manyTenants, tenants, fmt.Sprintf("%d tenants", many)); err != nil {
			return nil, err
		}
		err := withNoops(ctx, n, ids, func() error {
			return keepBest(&manyTools, spread, fmt.Sprintf("%d tools", many))
		})
		if err != nil {
			return nil, err
		}
	}
	return []Flatness{
		{Name: fmt.Sprintf("1 -> %d tenants", many), Base: few, Many: manyTenants},
		{Name: fmt.Sprintf("~10 -> %d tools", many), Base: few, Many: manyTools},
	}, nil
}

// withNoops runs f with a copy of the no-op tool registered under each of
// ids, and removes them afterwards, waiting until the registry has let
// them go: the series after it measure with the examples alone.
func withNoops(ctx context.Context, nd *node.Node, ids []string, f func() error) error {
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		for _, id := range ids {
			_ = nd.Store.PurgeTool(dctx, id, "1.0.0")
		}
		for nd.Registry.Has(ids[len(ids)-1], "1.0.0") && dctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
	}()
	if err := registerNoops(ctx, nd, ids); err != nil {
		return err
	}
	return f()
}

// registerNoops registers a copy of the no-op tool under each of ids and
// waits until the node's registry holds the first and the last.
func registerNoops(ctx context.Context, nd *node.Node, ids []string) error {
	for _, id := range ids {
		doc := fmt.Sprintf(`{"id":%q,"name":"flat no-op","version":"1.0.0","description":"a no-op among many",`+
			`"category":"utility","kind":"builtin","builtin":{"function":"noop"},"input_schema":{"type":"object"},`+
			`"output_schema":{"type":"object"},"safety":{"risk_level":"low","idempotent":true},"limits":{"timeout_ms":1000,"concurrent_per_agent":100000},`+
			`"rate_limit":{"requests":1000000,"per_seconds":1,"burst":1000000}}`, id)
		if _, err := nd.Store.RegisterTool(ctx, []byte(doc), true); err != nil {
			return fmt.Errorf("registering %s: %w", id, err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, id := range []string{ids[0], ids[len(ids)-1]} {
		if err := nd.WaitForTool(wctx, id, "1.0.0"); err != nil {
			return err
		}
	}
	return nil
}

// spreadTarget offers calls round-robin over tenants (one token each, no
// budget) and over toolIDs.
func spreadTarget(nc *nats.Conn, cred credentials, tenants int, toolIDs []string) (*target, func(), error) {
	c, err := client.New(nc)
	if err != nil {
		return nil, nil, err
	}
	type caller struct{ tenant, tok string }
	callers := make([]caller, tenants)
	for i := range callers {
		tenant := benchTenant
		if tenants > 1 {
			tenant = fmt.Sprintf("flat%05d", i)
		}
		tok, err := token.Mint(cred.key, token.Claims{
			ToolID: token.Patterns{"*"}, TenantID: tenant, AgentDID: benchAgent,
			RegisteredClaims: jwt.RegisteredClaims{
				ID:     fmt.Sprintf("flat-%d-%d", time.Now().UnixNano(), i),
				Issuer: benchIssuer, Audience: jwt.ClaimStrings{benchAudience},
				ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour)),
			},
		})
		if err != nil {
			return nil, nil, err
		}
		callers[i] = caller{tenant, tok}
	}
	t := &target{name: "spread"}
	sub, err := nc.Subscribe(subjects.ResultAll, func(m *nats.Msg) {
		resp, err := client.DecodeResult(m.Data)
		if err == nil && resp.Status == api.StatusSuccess {
			t.mark(resp.InvocationID)
		}
	})
	if err != nil {
		return nil, nil, err
	}
	t.publish = func(ctx context.Context, key string, i int) error {
		cl := callers[i%len(callers)]
		req := api.Request{ToolID: toolIDs[i%len(toolIDs)], Parameters: json.RawMessage(`{}`), CapabilityToken: cl.tok,
			AgentContext: api.AgentContext{AgentDID: benchAgent, TenantID: cl.tenant, SessionID: "s" + strconv.Itoa(i%len(callers))}}
		_, err := c.Invoke(ctx, req, client.InvokeOptions{ID: key})
		return err
	}
	return t, func() { _ = sub.Unsubscribe() }, nil
}

// printFlatness writes each series beside its baseline with the goal.
func printFlatness(w io.Writer, fs []Flatness) {
	if len(fs) == 0 {
		return
	}
	fmt.Fprintf(w, "\nper-invocation cost with many tools and tenants (saturation, best of %d; cost ratio = few/many):\n", flatRuns)
	fmt.Fprintf(w, "%-40s %12s %12s %8s %8s  %s\n", "series", "few", "many", "ratio", "goal", "")
	for _, f := range fs {
		r := f.Ratio()
		v := "met"
		if r > 1.2 {
			v = "NOT MET"
		}
		fmt.Fprintf(w, "%-40s %10.0f/s %10.0f/s %8.2f %8s  %s\n", f.Name, f.Base.Throughput(), f.Many.Throughput(), r, "<=1.2", v)
	}
}
