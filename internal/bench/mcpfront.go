package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/mcpfront"
)

const frontSamples = 400

// measureFront times, on a running toolgate, one call of the noop tool
// four ways, interleaved so that all four see the same load: a direct
// tool.invoke published and awaited the way the MCP front end itself does
// (mcpfront.NATSBus: one result subscription per tenant), and a tools/call
// through the MCP front end over an in-memory stdio-like transport and over
// streamable HTTP, from the SDK's client and from a plain HTTP client. The
// difference is what speaking MCP adds to a call; the plain client's shows
// the front end's part apart from the SDK client's. Beside them, in the
// same rounds, the floors under them: the direct call made from a tool of
// the SDK's own server (over each transport) and from a bare HTTP handler.
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
	stdio, srv, raw, err := serveFront(ctx, front, cred.token)
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	defer stdio.Close()
	hc := &http.Client{Transport: bearer{cred.token}}
	overHTTP, err := mcp.NewClient(benchImpl, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		return nil, fmt.Errorf("mcp over http: %w", err)
	}
	defer overHTTP.Close()

	direct := directCall(bus, cred.token)
	// The floors, for any front end: an HTTP handler that makes the direct
	// call, and the SDK's own server (over HTTP answering in JSON) with a
	// tool that makes it, nothing of the front end's around it.
	// Like the front end, each waits at most a bound.
	bounded := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return direct(ctx)
	}
	reply := []byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"{\"ok\":true}"}],"structuredContent":{"ok":true}}}`)
	bare := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if err := bounded(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(reply)
	}))
	defer bare.Close()
	sdkStdio, sdkRaw, stopSDK, err := serveSDK(ctx, bounded, cred.token)
	if err != nil {
		return nil, err
	}
	defer stopSDK()
	bareRaw := &rawMCP{url: bare.URL, token: cred.token}
	calls := []func(context.Context) error{direct, callTool(stdio), callTool(overHTTP), raw.call, callTool(sdkStdio), bareRaw.call, sdkRaw.call}
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
	drop, err := measureDrop(ctx, bus, srv.URL+"/mcp", cred.token)
	if err != nil {
		return nil, fmt.Errorf("dropped connection: %w", err)
	}
	names := []string{"direct tool.invoke", "MCP tools/call, stdio", "MCP tools/call, HTTP", "MCP tools/call, HTTP, plain",
		"floor: SDK server, stdio", "floor: HTTP handler, plain", "floor: SDK server, HTTP, plain"}
	out := make([]Cost, len(calls))
	for j := range calls {
		slices.Sort(samples[j])
		out[j] = Cost{Name: names[j], Samples: samples[j]}
	}
	own, err := measureFrontAlone(ctx, bus, cred, aloneSamples)
	if err != nil {
		return nil, fmt.Errorf("the front end against a bus that answers at once: %w", err)
	}
	return append(append(out, own...), drop), nil
}

// answering is the bus's registry with every call answered at once: a
// call through the front end, or through the SDK's own server, then costs
// what that server does and nothing of the pipeline's, whose milliseconds
// of latency, the same under both, would hide a difference of tenths of a
// millisecond in their noise.
type answering struct{ mcpfront.Bus }

func (answering) Invoke(context.Context, api.Request, string) error { return nil }

func (answering) Wait(_ context.Context, _, id string) (api.Response, error) {
	return api.Response{InvocationID: id, Status: api.StatusSuccess, Result: json.RawMessage(`{"ok":true}`)}, nil
}

// aloneSamples is how many calls each path of measureFrontAlone makes.
const aloneSamples = 3000

// Names of measureFrontAlone's paths, which the goal compares.
const (
	aloneFrontStdio = "alone: front end, stdio"
	aloneFrontHTTP  = "alone: front end, HTTP, plain"
	aloneSDKStdio   = "alone: SDK server, stdio"
	aloneSDKHTTP    = "alone: SDK server, HTTP, plain"
)

// measureFrontAlone times n tools/calls of the front end and of the SDK's
// own server with a tool that makes the same call, on each transport,
// interleaved, against a bus that answers at once (answering): the front
// end's own cost over the SDK's.
func measureFrontAlone(ctx context.Context, real mcpfront.Bus, cred credentials, n int) ([]Cost, error) {
	bus := answering{real}
	front, err := mcpfront.Start(ctx, mcpfront.Config{Bus: bus, Verifier: cred.verifier, Log: discardLogger()})
	if err != nil {
		return nil, err
	}
	frontStdio, srv, frontRaw, err := serveFront(ctx, front, cred.token)
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	defer frontStdio.Close()
	sdkStdio, sdkRaw, stopSDK, err := serveSDK(ctx, directCall(bus, cred.token), cred.token)
	if err != nil {
		return nil, err
	}
	defer stopSDK()

	names := []string{aloneFrontStdio, aloneSDKStdio, aloneFrontHTTP, aloneSDKHTTP}
	calls := []func(context.Context) error{callTool(frontStdio), callTool(sdkStdio), frontRaw.call, sdkRaw.call}
	samples := make([][]time.Duration, len(calls))
	const warm = 100
	for i := range warm + n {
		for j, call := range calls {
			cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
			start := time.Now()
			err := call(cctx)
			d := time.Since(start)
			ccancel()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", names[j], err)
			}
			if i >= warm {
				samples[j] = append(samples[j], d)
			}
		}
	}
	out := make([]Cost, len(calls))
	for j := range calls {
		slices.Sort(samples[j])
		out[j] = Cost{Name: names[j], Samples: samples[j]}
	}
	return out, nil
}

var benchImpl = &mcp.Implementation{Name: "bench", Version: "1"}

// directCall is a tool.invoke of the noop tool on bus, awaited the way the
// MCP front end awaits its calls.
func directCall(bus mcpfront.Bus, tok string) func(context.Context) error {
	req := api.Request{ToolID: "noop", Parameters: json.RawMessage(`{}`), CapabilityToken: tok,
		AgentContext: api.AgentContext{AgentDID: benchAgent, TenantID: benchTenant}}
	return func(ctx context.Context) error {
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
}

// callTool is a tools/call of the noop tool in session cs.
func callTool(cs *mcp.ClientSession) func(context.Context) error {
	return func(ctx context.Context) error {
		r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "noop", Arguments: map[string]any{}})
		if err == nil && r.IsError {
			err = fmt.Errorf("mcp call: %v", r.Content)
		}
		return err
	}
}

// serveFront serves front to an SDK client over an in-memory stdio-like
// transport and over streamable HTTP, where a plain client is connected.
func serveFront(ctx context.Context, front *mcpfront.Front, tok string) (*mcp.ClientSession, *httptest.Server, *rawMCP, error) {
	ct, st := mcp.NewInMemoryTransports()
	go func() { _ = front.ServeStdio(ctx, st, nil, tok) }()
	stdio, err := mcp.NewClient(benchImpl, nil).Connect(ctx, ct, nil)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("mcp over stdio: %w", err)
	}
	srv := httptest.NewServer(front.Handler())
	raw, err := newRawMCP(ctx, srv.URL+"/mcp", tok)
	if err != nil {
		srv.Close()
		stdio.Close()
		return nil, nil, nil, fmt.Errorf("mcp over http, plain client: %w", err)
	}
	return stdio, srv, raw, nil
}

// serveSDK is the SDK's own server with a noop tool that makes call,
// nothing of the front end's around it: a session over an in-memory
// stdio-like transport, and a plain client over HTTP answering in JSON.
func serveSDK(ctx context.Context, call func(context.Context) error, tok string) (*mcp.ClientSession, *rawMCP, func(), error) {
	sdk := mcp.NewServer(&mcp.Implementation{Name: "floor", Version: "1"}, nil)
	sdk.AddTool(&mcp.Tool{Name: "noop", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if err := call(ctx); err != nil {
				return nil, err
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: `{"ok":true}`}},
				StructuredContent: json.RawMessage(`{"ok":true}`)}, nil
		})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return sdk },
		&mcp.StreamableHTTPOptions{JSONResponse: true}))
	raw, err := newRawMCP(ctx, srv.URL, tok)
	if err != nil {
		srv.Close()
		return nil, nil, nil, fmt.Errorf("the SDK's server alone: %w", err)
	}
	ct, st := mcp.NewInMemoryTransports()
	go func() {
		if ss, err := sdk.Connect(ctx, st, nil); err == nil {
			_ = ss.Wait()
		}
	}()
	stdio, err := mcp.NewClient(benchImpl, nil).Connect(ctx, ct, nil)
	if err != nil {
		srv.Close()
		return nil, nil, nil, fmt.Errorf("the SDK's server alone over stdio: %w", err)
	}
	return stdio, raw, func() { _ = stdio.Close(); srv.Close() }, nil
}

// dropName names the Cost of measureDrop.
const dropName = "dropped connection"

// dropBound is how soon a call whose HTTP connection dropped must have
// ended cancelled.
const dropBound = time.Second

// measureDrop starts a call of the sleep tool (8 s) over HTTP on a TCP
// connection of its own, closes the connection once the call runs, without
// a DELETE of the session, and returns how long the invocation then took
// to end, as one sample (named dropName, or with the status it ended with
// when that is not cancelled).
func measureDrop(ctx context.Context, bus *mcpfront.NATSBus, url, tok string) (Cost, error) {
	c, err := newRawMCP(ctx, url, tok)
	if err != nil {
		return Cost{}, err
	}
	host := strings.TrimPrefix(strings.TrimSuffix(url, "/mcp"), "http://")
	conn, err := net.Dial("tcp", host)
	if err != nil {
		return Cost{}, err
	}
	defer conn.Close()
	body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":8000}}}`
	if _, err := fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"Accept: application/json, text/event-stream\r\nMcp-Protocol-Version: 2025-06-18\r\nMcp-Session-Id: %s\r\n"+
		"Content-Length: %d\r\n\r\n%s", host, tok, c.session, len(body), body); err != nil {
		return Cost{}, err
	}
	// The front end's invocation id of the session's request 7.
	id := uuid.NewSHA1(uuid.NameSpaceURL, []byte("urn:toolgate:mcp:"+c.session+":7")).String()
	status := func() api.Status {
		rec, err := bus.Status(ctx, benchTenant, id)
		if err != nil {
			return ""
		}
		return rec.Status
	}
	for deadline := time.Now().Add(10 * time.Second); status() != api.StatusRunning; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return Cost{}, fmt.Errorf("the call of the sleep tool never ran (status %q)", status())
		}
	}
	closed := time.Now()
	_ = conn.Close()
	for {
		st := status()
		if st.Terminal() {
			name := dropName
			if st != api.StatusCancelled {
				name += ", ended " + string(st)
			}
			return Cost{Name: name, Samples: []time.Duration{time.Since(closed)}}, nil
		}
		if time.Since(closed) > 15*time.Second {
			return Cost{Name: dropName + ", not ended", Samples: []time.Duration{time.Since(closed)}}, nil
		}
		time.Sleep(2 * time.Millisecond)
	}
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
	var drop *Cost
	byName := map[string]Cost{}
	var alone []Cost
	for _, c := range costs {
		byName[c.Name] = c
		switch {
		case strings.HasPrefix(c.Name, dropName):
			drop = &c
			continue
		case strings.HasPrefix(c.Name, "alone: "):
			alone = append(alone, c)
			continue
		}
		fmt.Fprintf(w, "%-30s %10s %10s %12s %12s\n", c.Name, us(c.quantile(0.5)), us(c.quantile(0.99)),
			us(c.quantile(0.5)-base.quantile(0.5)), us(c.quantile(0.99)-base.quantile(0.99)))
	}
	if len(alone) > 0 {
		fmt.Fprintf(w, "the same against a bus that answers at once (the front end's own cost), %d calls each, interleaved\n", aloneSamples)
		fmt.Fprintf(w, "%-30s %10s %10s\n", "path", "p50", "p99")
		for _, c := range alone {
			fmt.Fprintf(w, "%-30s %10s %10s\n", c.Name, us(c.quantile(0.5)), us(c.quantile(0.99)))
		}
	}
	// The goal: the front end adds at most 0.1 ms p50 over the SDK's own
	// server on each transport, measured where nothing else differs.
	for _, g := range []struct{ name, front, floor string }{
		{"stdio", aloneFrontStdio, aloneSDKStdio},
		{"HTTP", aloneFrontHTTP, aloneSDKHTTP},
	} {
		f, ok1 := byName[g.front]
		b, ok2 := byName[g.floor]
		if !ok1 || !ok2 {
			continue
		}
		added := f.quantile(0.5) - b.quantile(0.5)
		fmt.Fprintf(w, "%-30s %10s %10s %12s %12s  %s\n", "goal: front over SDK, "+g.name, "", "", us(added), "<=100µs",
			verdict(added <= 100*time.Microsecond))
	}
	if drop != nil {
		// A call whose HTTP connection closed (no DELETE) ends cancelled.
		d := drop.quantile(0)
		fmt.Fprintf(w, "goal: a call over HTTP whose connection closes ends cancelled within %v: %s after the close (%s)  %s\n",
			dropBound, us(d), drop.Name, verdict(drop.Name == dropName && d <= dropBound))
	}
}

// rawMCP is an MCP client over streamable HTTP with nothing but net/http:
// one POST per message, the answer read as the server sends it. It shows
// what the front end itself adds, apart from the cost of an SDK client.
type rawMCP struct {
	url, token, session string
	n                   int
}

func newRawMCP(ctx context.Context, url, token string) (*rawMCP, error) {
	c := &rawMCP{url: url, token: token}
	resp, err := c.post(ctx, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}`)
	if err != nil {
		return nil, err
	}
	c.session = resp.Header.Get("Mcp-Session-Id")
	if _, err := c.post(ctx, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *rawMCP) post(ctx context.Context, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	if c.session != "" {
		req.Header.Set("Mcp-Session-Id", c.session)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s: %s", resp.Status, b)
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return resp, nil
}

func (c *rawMCP) call(ctx context.Context) error {
	c.n++
	resp, err := c.post(ctx, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"noop","arguments":{}}}`, c.n))
	if err != nil {
		return err
	}
	b, _ := io.ReadAll(resp.Body)
	if !bytes.Contains(b, []byte(`"result"`)) || bytes.Contains(b, []byte(`"isError":true`)) {
		return fmt.Errorf("mcp call: %s", b)
	}
	return nil
}
