package mcpfront_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/internal/mcpfront"
	"github.com/toolgate/toolgate/internal/token"
)

var transports = []transport{overHTTP, overStdio}

// TestListAndCall: the tools a token grants, with schemas, hints and
// deprecation, over pages; a call answered with structured content; both
// transports.
func TestListAndCall(t *testing.T) {
	e := newEnv(t)
	tok := mint(t, token.Claims{ExcludedSideEffects: []string{"network"}})
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			cs := e.connect(tr, tok, nil)
			init := cs.InitializeResult()
			if init.ServerInfo.Name != mcpfront.ServerName || init.ServerInfo.Version == "" {
				t.Errorf("server info %+v", init.ServerInfo)
			}
			if init.Capabilities.Tools == nil || !init.Capabilities.Tools.ListChanged {
				t.Errorf("tools capability %+v", init.Capabilities.Tools)
			}

			// One page holds 3 tools: the first page has a cursor.
			ctx := context.Background()
			page, err := cs.ListTools(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Tools) != 3 || page.NextCursor == "" {
				t.Errorf("first page: %d tools, cursor %q", len(page.Tools), page.NextCursor)
			}
			tools := listNames(t, cs)
			var names []string
			for n := range tools {
				names = append(names, n)
			}
			slices.Sort(names)
			// t.fetch has a network side effect the token excludes;
			// other.tool is not granted.
			want := []string{"t.echo", "t.old", "t.progress", "t.risky", "t.slow", "t.write"}
			if !slices.Equal(names, want) {
				t.Fatalf("tools %v, want %v", names, want)
			}
			echo := tools["t.echo"]
			if echo.Title != "Echo" || echo.OutputSchema == nil || !strings.Contains(string(mustJSON(echo.InputSchema)), `"maxLength":64`) {
				t.Errorf("echo: title %q, input %s, output %v", echo.Title, mustJSON(echo.InputSchema), echo.OutputSchema)
			}
			if a := echo.Annotations; !a.ReadOnlyHint || !a.IdempotentHint || *a.DestructiveHint || *a.OpenWorldHint {
				t.Errorf("echo annotations %+v", a)
			}
			if a := tools["t.write"].Annotations; a.ReadOnlyHint || !a.IdempotentHint || !*a.DestructiveHint {
				t.Errorf("write annotations %+v", a)
			}
			old := tools["t.old"]
			if !strings.Contains(old.Title, "deprecated") || !strings.Contains(old.Description, "use t.echo instead") ||
				old.Meta[mcpfront.MetaLifecycle] != "deprecated" {
				t.Errorf("deprecated tool: %q %q %v", old.Title, old.Description, old.Meta)
			}

			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t.echo", Arguments: map[string]any{"message": "hello"}})
			if err != nil {
				t.Fatal(err)
			}
			if res.IsError || !strings.Contains(text(res), `"hello"`) {
				t.Fatalf("result %+v %s", res, text(res))
			}
			var sc map[string]any
			if err := json.Unmarshal(mustJSON(res.StructuredContent), &sc); err != nil || sc["message"] != "hello" {
				t.Errorf("structured content %v", res.StructuredContent)
			}
			if ev := e.audited(invocationOf(res)); ev["status"] != "success" || ev["tool_id"] != "t.echo" {
				t.Errorf("audit %v", ev)
			}
			// The receipt in _meta: audit's signature, of this call and
			// of the result the content holds.
			var rc api.Receipt
			if err := json.Unmarshal(mustJSON(res.Meta[mcpfront.MetaReceipt]), &rc); err != nil {
				t.Fatalf("_meta receipt %v: %v", res.Meta, err)
			}
			if err := auditchain.CheckReceipt(&rc, e.chainKey.Public().(ed25519.PublicKey)); err != nil {
				t.Errorf("the receipt in _meta: %v", err)
			}
			if err := auditchain.CheckReceiptResult(&rc, []byte(text(res))); err != nil || rc.InvocationID != invocationOf(res) || rc.Agent != agent {
				t.Errorf("the receipt %+v of the result %s: %v", rc, text(res), err)
			}
			if err := auditchain.CheckReceiptResult(&rc, []byte(`{"message":"other"}`)); err == nil {
				t.Error("the receipt holds for another result")
			}
		})
	}
}

// TestProtocolVersions: both revisions the front end is held to negotiate.
func TestProtocolVersions(t *testing.T) {
	e := newEnv(t)
	srv := httptest.NewServer(e.front.Handler())
	defer srv.Close()
	tok := mint(t, token.Claims{})
	for _, v := range []string{"2025-06-18", "2025-11-25"} {
		body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + v +
			`","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
		resp := post(t, srv.URL, tok, "", body)
		if !strings.Contains(resp, `"protocolVersion":"`+v+`"`) || !strings.Contains(resp, `"name":"toolgate"`) {
			t.Errorf("initialize %s: %s", v, resp)
		}
	}
}

// post sends one JSON-RPC message over HTTP and returns the response body.
func post(t *testing.T, url, tok, session, body string) string {
	t.Helper()
	return postWith(t, url, tok, session, body, nil)
}

// postWith is post with headers of the test's own.
func postWith(t *testing.T, url, tok, session, body string, h http.Header) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/mcp", strings.NewReader(body))
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Status + " " + resp.Header.Get("Mcp-Session-Id") + " " + string(b)
}

// TestHTTPAuth: no token, a bad token and a token for another tenant than
// the endpoint serves are 401 with a Bearer challenge; nothing reaches
// toolgate.
func TestHTTPAuth(t *testing.T) {
	e := newEnv(t)
	f, err := mcpfront.Start(context.Background(), mcpfront.Config{Bus: busOf(t, e), Verifier: verifier(), Tenant: tenant, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(f.Handler())
	defer srv.Close()
	other := mint(t, token.Claims{TenantID: "globex"})
	expired := mint(t, token.Claims{})
	// The signature's first character carries six whole bits, so changing
	// it always breaks the signature.
	sig := strings.LastIndexByte(expired, '.') + 1
	swap := map[byte]string{'A': "B"}[expired[sig]]
	if swap == "" {
		swap = "A"
	}
	expired = expired[:sig] + swap + expired[sig+1:]
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	for name, header := range map[string]string{
		"missing":      "",
		"not bearer":   "Basic dXNlcjpwYXNz",
		"bad":          "Bearer " + expired,
		"other tenant": "Bearer " + other,
	} {
		t.Run(name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/mcp", strings.NewReader(init))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if header != "" {
				req.Header.Set("Authorization", header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&body)
			if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), `Bearer realm="toolgate"`) {
				t.Fatalf("%s, WWW-Authenticate %q", resp.Status, resp.Header.Get("WWW-Authenticate"))
			}
			if body["code"] != string(api.PermissionDenied) || body["e_code"] == "" {
				t.Errorf("body %v", body)
			}
		})
	}
	t.Run("stdio, other tenant", func(t *testing.T) {
		_, st := mcp.NewInMemoryTransports()
		err := f.ServeStdio(context.Background(), st, nil, other)
		if !errors.Is(err, api.NewError(api.PermissionDenied, api.ENotGranted, "")) {
			t.Errorf("stdio with another tenant's token: %v", err)
		}
	})
	t.Run("session of another agent", func(t *testing.T) {
		first := post(t, srv.URL, mint(t, token.Claims{}), "", init)
		sid := strings.Fields(first)[2]
		thief := mint(t, token.Claims{AgentDID: "did:agent:thief"})
		got := post(t, srv.URL, thief, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
		if !strings.HasPrefix(got, "401") {
			t.Errorf("another agent's token on the session: %s", got)
		}
	})
}

// TestErrors: refusals are isError results a model can act on, with
// toolgate's codes and an audit event; protocol errors are JSON-RPC errors.
func TestErrors(t *testing.T) {
	e := newEnv(t)
	tok := mint(t, token.Claims{})
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			cs := e.connect(tr, tok, nil)
			ctx := context.Background()

			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t.echo", Arguments: map[string]any{"message": 42}})
			if err != nil {
				t.Fatal(err)
			}
			te := toolgateError(t, res)
			t.Logf("schema-invalid call, as the model reads it:\n%s", text(res))
			if !res.IsError || te.Code != api.InvalidParameters || !strings.Contains(text(res), "Fix the arguments") ||
				!strings.Contains(text(res), "/message") {
				t.Errorf("schema-invalid: %+v %s", te, text(res))
			}
			if ev := e.audited(invocationOf(res)); ev["status"] != "error" {
				t.Errorf("audit of the invalid call %v", ev)
			}

			big := strings.Repeat("x", mcpfront.DefaultMaxArgumentBytes)
			res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "t.echo", Arguments: map[string]any{"message": big}})
			if err != nil {
				t.Fatal(err)
			}
			if te := toolgateError(t, res); !res.IsError || te.ECode != api.EPayloadTooLarge {
				t.Errorf("oversized: %+v", te)
			}

			_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "other.tool", Arguments: map[string]any{}})
			var we *jsonrpc.Error
			if !errors.As(err, &we) || we.Code != jsonrpc.CodeInvalidParams || !strings.Contains(we.Message, "unknown tool") {
				t.Errorf("ungranted tool: %v", err)
			}
			_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "no.such", Arguments: map[string]any{}})
			if !errors.As(err, &we) || we.Code != jsonrpc.CodeInvalidParams {
				t.Errorf("unknown tool: %v", err)
			}
			if err := cs.Ping(ctx, nil); err != nil {
				t.Errorf("ping: %v", err)
			}
			//lint:ignore SA1019 logging/setLevel is part of the protocol revisions served (2025-06-18, 2025-11-25)
			if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
				t.Errorf("logging/setLevel: %v", err)
			}
		})
	}
}

// TestMalformedJSONRPC: broken JSON and invalid requests get the JSON-RPC
// codes the spec names.
func TestMalformedJSONRPC(t *testing.T) {
	e := newEnv(t)
	srv := httptest.NewServer(e.front.Handler())
	defer srv.Close()
	tok := mint(t, token.Claims{})
	first := post(t, srv.URL, tok, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	sid := strings.Fields(first)[2]
	post(t, srv.URL, tok, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if got := post(t, srv.URL, tok, sid, `{"jsonrpc":"2.0","id":2,"method":`); !strings.HasPrefix(got, "400") {
		t.Errorf("broken JSON: %s", got)
	}
	if got := post(t, srv.URL, tok, sid, `{"jsonrpc":"2.0","id":3,"method":"no/such/method"}`); !strings.Contains(got, "-32601") {
		t.Errorf("unknown method: %s", got)
	}
	if got := post(t, srv.URL, tok, sid, `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":7}}`); !strings.Contains(got, "-32602") {
		t.Errorf("bad params: %s", got)
	}
}

// TestStdioRawJSONRPC: over stdio an unknown method is -32601 and a
// tools/call without a name -32602, from the SDK's server.
func TestStdioRawJSONRPC(t *testing.T) {
	e := newEnv(t)
	ct, st := mcp.NewInMemoryTransports()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() { _ = e.front.ServeStdio(ctx, st, nil, mint(t, token.Claims{})) }()
	conn, err := ct.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	call := func(id int64, method, params string) *jsonrpc.Response {
		t.Helper()
		jid, _ := jsonrpc.MakeID(float64(id))
		req := &jsonrpc.Request{ID: jid, Method: method}
		if params != "" {
			req.Params = json.RawMessage(params)
		}
		if err := conn.Write(ctx, req); err != nil {
			t.Fatal(err)
		}
		for {
			m, err := conn.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if r, ok := m.(*jsonrpc.Response); ok {
				return r
			}
		}
	}
	if r := call(1, "initialize", `{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}`); r.Error != nil {
		t.Fatal(r.Error)
	}
	_ = conn.Write(ctx, &jsonrpc.Request{Method: "notifications/initialized", Params: json.RawMessage(`{}`)})
	var we *jsonrpc.Error
	if r := call(2, "no/such/method", `{}`); !errors.As(r.Error, &we) || we.Code != jsonrpc.CodeMethodNotFound {
		t.Errorf("unknown method: %v", r.Error)
	}
	if r := call(3, "tools/call", `{"arguments":{}}`); !errors.As(r.Error, &we) || we.Code != jsonrpc.CodeInvalidParams {
		t.Errorf("tools/call without a name: %v", r.Error)
	}
	if r := call(4, "ping", ""); r.Error != nil {
		t.Errorf("ping: %v", r.Error)
	}
	// A call the client cancels gets no response: the next one read is
	// the ping's, sent after the cancel was handled.
	jid, _ := jsonrpc.MakeID(float64(5))
	if err := conn.Write(ctx, &jsonrpc.Request{ID: jid, Method: "tools/call", Params: json.RawMessage(`{"name":"t.slow","arguments":{}}`)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.slowStarted:
	case <-ctx.Done():
		t.Fatal("t.slow did not start")
	}
	if err := conn.Write(ctx, &jsonrpc.Request{Method: "notifications/cancelled", Params: json.RawMessage(`{"requestId":5,"reason":"gave up"}`)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.slowEnded:
	case <-ctx.Done():
		t.Fatal("the cancelled call's tool did not stop")
	}
	if r := call(6, "ping", ""); r.ID.Raw() != int64(6) {
		t.Errorf("after a cancelled call, the response read is to %v, want the ping's (6)", r.ID.Raw())
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// keep time imported for helpers added later.
var _ = time.Second
