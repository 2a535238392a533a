package mcpfront_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/mcpfront"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
)

// instantBus answers every call at once: what remains is the MCP front
// end's own cost per call.
type instantBus struct{ m []*tools.Manifest }

func (instantBus) Invoke(context.Context, api.Request, string) error { return nil }
func (instantBus) Wait(_ context.Context, _, id string) (api.Response, error) {
	return api.Response{InvocationID: id, Status: api.StatusSuccess, Result: json.RawMessage(`{"ok":true}`)}, nil
}
func (instantBus) Status(context.Context, string, string) (api.Record, error) {
	return api.Record{}, nil
}
func (instantBus) Cancel(context.Context, string, string, string) error { return nil }
func (b instantBus) Tools() []*tools.Manifest                           { return b.m }
func (instantBus) WatchTools(context.Context, func()) error             { return nil }

// BenchmarkCallOverhead is one tools/call through the front end with a bus
// that answers at once, over each transport.
func BenchmarkCallOverhead(b *testing.B) {
	m, err := tools.Parse([]byte(testTools[0]))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f, err := mcpfront.Start(ctx, mcpfront.Config{Bus: instantBus{[]*tools.Manifest{m}}, Verifier: verifier(), Log: quiet()})
	if err != nil {
		b.Fatal(err)
	}
	tok := mint(b, token.Claims{})
	impl := &mcp.Implementation{Name: "bench", Version: "1"}
	for _, tr := range transports {
		b.Run(string(tr), func(b *testing.B) {
			var t mcp.Transport
			switch tr {
			case overHTTP:
				srv := httptest.NewServer(f.Handler())
				defer srv.Close()
				t = &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp", HTTPClient: &http.Client{Transport: bearerTransport{tok}}}
			case overStdio:
				ct, st := mcp.NewInMemoryTransports()
				go func() { _ = f.ServeStdio(ctx, st, nil, tok) }()
				t = ct
			}
			cs, err := mcp.NewClient(impl, nil).Connect(ctx, t, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer cs.Close()
			p := &mcp.CallToolParams{Name: "t.echo", Arguments: map[string]any{"message": "m"}}
			b.ResetTimer()
			for b.Loop() {
				if r, err := cs.CallTool(ctx, p); err != nil || r.IsError {
					b.Fatal(err, r)
				}
			}
		})
	}
}

// TestOneSessionPerClient: the SDK asks for a session's server on every
// HTTP request; only the request that opens a session may make one, so a
// client's many calls leave one session behind, and none once it leaves.
func TestOneSessionPerClient(t *testing.T) {
	m, err := tools.Parse([]byte(testTools[0]))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f, err := mcpfront.Start(ctx, mcpfront.Config{Bus: instantBus{[]*tools.Manifest{m}}, Verifier: verifier(), Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(f.Handler())
	defer srv.Close()
	tr := &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp", HTTPClient: &http.Client{Transport: bearerTransport{mint(t, token.Claims{})}}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			cs.Close()
		}
	}()
	for range 20 {
		if r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t.echo", Arguments: map[string]any{"message": "m"}}); err != nil || r.IsError {
			t.Fatal(err, r)
		}
	}
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if n := f.Sessions(); n != 1 {
		t.Fatalf("%d sessions held for one client, want 1", n)
	}
	cs.Close()
	closed = true
	eventually(t, 5*time.Second, "the session dropped", func() bool { return f.Sessions() == 0 })
}
