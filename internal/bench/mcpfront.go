package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/mcpfront"
)

const frontSamples = 400

// measureFront times, on a running toolgate, one call of the noop tool
// three ways, interleaved so that all three see the same load: a direct
// tool.invoke published and awaited the way the MCP front end itself does
// (mcpfront.NATSBus: one result subscription per tenant), and a tools/call through the MCP front end over an
// in-memory stdio-like transport and over streamable HTTP. The difference
// is what speaking MCP adds to a call.
func measureFront(ctx context.Context, url string, cred credentials) ([]Cost, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	bus, err := mcpfront.NewNATSBus(ctx, nc, discardLogger())
	if err != nil {
		return nil, err
	}
	front, err := mcpfront.Start(ctx, mcpfront.Config{Bus: bus, Verifier: cred.verifier, Log: discardLogger()})
	if err != nil {
		return nil, err
	}
	impl := &mcp.Implementation{Name: "bench", Version: "1"}

	ct, st := mcp.NewInMemoryTransports()
	go func() { _ = front.ServeStdio(ctx, st, nil, cred.token) }()
	stdio, err := mcp.NewClient(impl, nil).Connect(ctx, ct, nil)
	if err != nil {
		return nil, fmt.Errorf("mcp over stdio: %w", err)
	}
	defer stdio.Close()

	srv := httptest.NewServer(front.Handler())
	defer srv.Close()
	hc := &http.Client{Transport: bearer{cred.token}}
	overHTTP, err := mcp.NewClient(impl, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		return nil, fmt.Errorf("mcp over http: %w", err)
	}
	defer overHTTP.Close()

	req := api.Request{ToolID: "noop", Parameters: json.RawMessage(`{}`), CapabilityToken: cred.token,
		AgentContext: api.AgentContext{AgentDID: benchAgent, TenantID: benchTenant}}
	direct := func(ctx context.Context) error {
		id := uuid.NewString()
		if err := bus.Invoke(ctx, req, id); err != nil {
			return err
		}
		resp, err := bus.Wait(ctx, benchTenant, id)
		if err == nil && resp.Status != api.StatusSuccess {
			err = fmt.Errorf("direct call: %s", resp.Status)
		}
		return err
	}
	viaMCP := func(cs *mcp.ClientSession) func(context.Context) error {
		return func(ctx context.Context) error {
			r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "noop", Arguments: map[string]any{}})
			if err == nil && r.IsError {
				err = fmt.Errorf("mcp call: %v", r.Content)
			}
			return err
		}
	}
	calls := []func(context.Context) error{direct, viaMCP(stdio), viaMCP(overHTTP)}
	samples := make([][]time.Duration, len(calls))
	for i := range 20 + frontSamples {
		for j, call := range calls {
			cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
			start := time.Now()
			err := call(cctx)
			d := time.Since(start)
			ccancel()
			if err != nil {
				return nil, err
			}
			if i >= 20 {
				samples[j] = append(samples[j], d)
			}
		}
	}
	names := []string{"direct tool.invoke", "MCP tools/call, stdio", "MCP tools/call, HTTP"}
	out := make([]Cost, len(calls))
	for j := range calls {
		slices.Sort(samples[j])
		out[j] = Cost{Name: names[j], Samples: samples[j]}
	}
	return out, nil
}

type bearer struct{ tok string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.tok)
	return http.DefaultTransport.RoundTrip(r)
}

// PrintFront writes measureFront's figures: each path's latency and what it
// adds over the direct call.
func PrintFront(w io.Writer, costs []Cost) {
	if len(costs) == 0 {
		return
	}
	fmt.Fprintf(w, "\nMCP front end, noop tool through all six stages, %d sequential calls each, interleaved\n", frontSamples)
	fmt.Fprintf(w, "%-30s %10s %10s %12s %12s\n", "path", "p50", "p99", "added p50", "added p99")
	base := costs[0]
	for _, c := range costs {
		fmt.Fprintf(w, "%-30s %10s %10s %12s %12s\n", c.Name, us(c.quantile(0.5)), us(c.quantile(0.99)),
			us(c.quantile(0.5)-base.quantile(0.5)), us(c.quantile(0.99)-base.quantile(0.99)))
	}
}
