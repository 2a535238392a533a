package mcpfront_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/mcpfront"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
)

// pendingApproval waits until toolgate has parked a call of tenant and
// returns its invocation id.
func (e *env) pendingApproval(o *observed) string {
	e.t.Helper()
	var id string
	eventually(e.t, 15*time.Second, "the approval wait to be announced", func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		for _, p := range o.progress {
			if strings.Contains(p.Message, "waiting for a human to approve") {
				_, rest, _ := strings.Cut(p.Message, "(invocation ")
				id, _, _ = strings.Cut(rest, ")")
				return true
			}
		}
		return false
	})
	return id
}

// TestApproval: a high-risk call waits, announced by progress
// notifications, and completes once a human approves; a denied one is an
// isError result telling the model not to repeat it.
func TestApproval(t *testing.T) {
	e := newEnv(t)
	tok := mint(t, token.Claims{})
	for _, tr := range transports {
		for _, approve := range []bool{true, false} {
			name := string(tr) + map[bool]string{true: "/approve", false: "/deny"}[approve]
			t.Run(name, func(t *testing.T) {
				o := newObserved()
				cs := e.connect(tr, tok, o)
				type outcome struct {
					r   *mcp.CallToolResult
					err error
				}
				done := make(chan outcome, 1)
				go func() {
					p := &mcp.CallToolParams{Name: "t.risky", Arguments: map[string]any{}}
					p.SetProgressToken("approval-" + name)
					r, err := cs.CallTool(context.Background(), p)
					done <- outcome{r, err}
				}()
				id := e.pendingApproval(o)
				select {
				case out := <-done:
					t.Fatalf("the call ended while parked: %+v %v", out.r, out.err)
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if _, err := e.client.Decide(ctx, api.ApprovalDecision{Tenant: tenant, InvocationID: id, Approve: approve,
					DecidedBy: "did:user:reviewer", Reason: "test"}); err != nil {
					t.Fatal(err)
				}
				var out outcome
				select {
				case out = <-done:
				case <-time.After(20 * time.Second):
					t.Fatal("no result after the decision")
				}
				if out.err != nil {
					t.Fatal(out.err)
				}
				if approve {
					if out.r.IsError {
						t.Fatalf("approved call: %s", text(out.r))
					}
				} else {
					te := toolgateError(t, out.r)
					if !out.r.IsError || te.ECode != api.EApprovalDenied || !strings.Contains(text(out.r), "Do not repeat it") {
						t.Fatalf("denied call: %+v %s", te, text(out.r))
					}
					if ev := e.audited(id); ev["status"] != string(api.StatusPermissionDenied) {
						t.Errorf("audit of the denied call: %v", ev)
					}
				}
				if invocationOf(out.r) != id {
					t.Errorf("result of %s, parked %s", invocationOf(out.r), id)
				}
			})
		}
	}
}

// TestProgress: a tool's progress reaches a client that sent a progress
// token, in order.
func TestProgress(t *testing.T) {
	e := newEnv(t)
	tok := mint(t, token.Claims{})
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			o := newObserved()
			cs := e.connect(tr, tok, o)
			done := make(chan *mcp.CallToolResult, 1)
			go func() {
				p := &mcp.CallToolParams{Name: "t.progress", Arguments: map[string]any{}}
				p.SetProgressToken(42)
				r, err := cs.CallTool(context.Background(), p)
				if err != nil {
					t.Error(err)
				}
				done <- r
			}()
			for i := 1; i <= 3; i++ {
				e.progressGo <- struct{}{}
				want := []string{"", "33:step 1 of 3", "67:step 2 of 3", "100:step 3 of 3"}[i]
				if i < 3 {
					eventually(t, 10*time.Second, want, func() bool {
						for _, m := range o.progressMessages() {
							if m == want {
								return true
							}
						}
						return false
					})
				}
			}
			r := <-done
			if r == nil || r.IsError {
				t.Fatalf("result %+v", r)
			}
			msgs := o.progressMessages()
			if len(msgs) < 2 || msgs[0] != "33:step 1 of 3" || msgs[1] != "67:step 2 of 3" {
				t.Errorf("progress %v", msgs)
			}
		})
	}
}

// TestCancel: notifications/cancelled (the SDK's client sends it when the
// call's context ends) cancels the invocation in toolgate.
func TestCancel(t *testing.T) {
	e := newEnv(t)
	tok := mint(t, token.Claims{})
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			cs := e.connect(tr, tok, nil)
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t.slow", Arguments: map[string]any{}})
				errc <- err
			}()
			<-e.slowStarted
			cancel()
			select {
			case <-e.slowEnded:
			case <-time.After(15 * time.Second):
				t.Fatal("the tool was not cancelled")
			}
			if err := <-errc; err == nil {
				t.Error("the cancelled call returned no error")
			}
		})
	}
}

// TestDisconnect: a client that goes away has its calls cancelled: over
// stdio when its pipes close (the process died), over HTTP when its session
// is deleted. (The SDK client's own Close waits for calls in flight, so the
// test cuts the connection itself.)
func TestDisconnect(t *testing.T) {
	e := newEnv(t)
	tok := mint(t, token.Claims{})
	t.Run("stdio", func(t *testing.T) {
		toServer, fromClient := io.Pipe()
		toClient, fromServer := io.Pipe()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			_ = e.front.ServeStdio(ctx, &mcp.IOTransport{Reader: toServer, Writer: fromServer}, nil, tok)
		}()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "dies", Version: "1"}, nil).
			Connect(ctx, &mcp.IOTransport{Reader: toClient, Writer: fromClient}, nil)
		if err != nil {
			t.Fatal(err)
		}
		go func() { _, _ = cs.CallTool(ctx, &mcp.CallToolParams{Name: "t.slow", Arguments: map[string]any{}}) }()
		<-e.slowStarted
		_ = fromClient.Close() // the client process is gone
		_ = toClient.Close()
		select {
		case <-e.slowEnded:
		case <-time.After(15 * time.Second):
			t.Fatal("the tool outlived its client")
		}
	})
	t.Run("http", func(t *testing.T) {
		url := newHTTP(t, e)
		cs := e.connectTo(url, tok)
		go func() {
			_, _ = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "t.slow", Arguments: map[string]any{}})
		}()
		<-e.slowStarted
		req, _ := http.NewRequest(http.MethodDelete, url+"/mcp", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Mcp-Session-Id", cs.ID())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		select {
		case <-e.slowEnded:
		case <-time.After(15 * time.Second):
			t.Fatalf("the tool outlived its deleted session (DELETE: %s)", resp.Status)
		}
	})
}

// TestDroppedConnection: a client whose TCP connection closes while its
// call runs, without a DELETE of its session, has the call cancelled: the
// tool's context ends within a bound, and the invocation ends cancelled,
// audited as such.
func TestDroppedConnection(t *testing.T) {
	e := newEnv(t)
	tok := mint(t, token.Claims{})
	url := newHTTP(t, e)
	first := post(t, url, tok, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	sid := strings.Fields(first)[2]
	post(t, url, tok, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)

	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t.slow","arguments":{}}}`
	fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"Accept: application/json, text/event-stream\r\nMcp-Protocol-Version: 2025-06-18\r\nMcp-Session-Id: %s\r\n"+
		"Content-Length: %d\r\n\r\n%s", strings.TrimPrefix(url, "http://"), tok, sid, len(body), body)
	select {
	case <-e.slowStarted:
	case <-time.After(15 * time.Second):
		t.Fatal("the call did not start")
	}
	closed := time.Now()
	_ = conn.Close() // the client is gone; its session is not deleted
	const bound = 5 * time.Second
	select {
	case <-e.slowEnded:
		t.Logf("tool cancelled %v after the connection closed", time.Since(closed).Round(time.Millisecond))
	case <-time.After(bound):
		t.Fatalf("the tool still ran %v after its client's connection closed", bound)
	}
	// The invocation of session sid's request 7 (the front end's id).
	id := uuid.NewSHA1(uuid.NameSpaceURL, []byte("urn:toolgate:mcp:"+sid+":7")).String()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	eventually(t, 10*time.Second, "the invocation to end", func() bool {
		rec, err := e.client.Status(ctx, tenant, id)
		return err == nil && rec.Status.Terminal()
	})
	if rec, _ := e.client.Status(ctx, tenant, id); rec.Status != api.StatusCancelled {
		t.Fatalf("invocation %s ended %s, want cancelled", id, rec.Status)
	}
	ev := e.audited(id)
	if ev["status"] != string(api.StatusCancelled) {
		t.Fatalf("audit event of %s: %v", id, ev)
	}
	if e.front.Sessions() != 1 {
		t.Errorf("sessions: %d, want the dropped client's session kept (it may reconnect)", e.front.Sessions())
	}
}

// TestConcurrentSessions: a slow call in one session blocks neither
// another session nor other calls of its own.
func TestConcurrentSessions(t *testing.T) {
	e := newEnv(t)
	tok := mint(t, token.Claims{})
	slow := e.connect(overHTTP, tok, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _, _ = slow.CallTool(ctx, &mcp.CallToolParams{Name: "t.slow", Arguments: map[string]any{}}) }()
	<-e.slowStarted
	sessions := []*mcp.ClientSession{slow}
	for range 3 {
		sessions = append(sessions, e.connect(overHTTP, tok, nil), e.connect(overStdio, tok, nil))
	}
	var wg sync.WaitGroup
	for i, cs := range sessions {
		for j := range 3 {
			wg.Go(func() {
				cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer ccancel()
				r, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: "t.echo", Arguments: map[string]any{"message": strings.Repeat("m", i+j)}})
				if err != nil || r.IsError {
					t.Errorf("session %d call %d: %v %v", i, j, err, r)
				}
			})
		}
	}
	wg.Wait()
	cancel()
	<-e.slowEnded
}

// TestListChanged: registering a tool the token grants notifies the
// session and lists it; one it does not grant changes nothing visible.
func TestListChanged(t *testing.T) {
	e := newEnv(t)
	tok := mint(t, token.Claims{})
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			o := newObserved()
			cs := e.connect(tr, tok, o)
			id := "t.new_" + string(tr)
			e.register(`{"id":"` + id + `","name":"New","version":"1.0.0","description":"Just registered.","kind":"builtin","builtin":{"function":"noop"},
			  "input_schema":{"type":"object"},"output_schema":{"type":"object"}}`)
			select {
			case <-o.changed:
			case <-time.After(15 * time.Second):
				t.Fatal("no notifications/tools/list_changed")
			}
			eventually(t, 10*time.Second, id+" listed", func() bool { return listNames(t, cs)[id] != nil })
		})
	}
}

// TestRetriedRequestDedupes: the same session and request id is one
// invocation.
func TestRetriedRequestDedupes(t *testing.T) {
	e := newEnv(t)
	srv := newHTTP(t, e)
	tok := mint(t, token.Claims{})
	first := post(t, srv, tok, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	sid := strings.Fields(first)[2]
	post(t, srv, tok, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	call := `{"jsonrpc":"2.0","id":"call-7","method":"tools/call","params":{"name":"t.echo","arguments":{"message":"once"}}}`
	a, b := post(t, srv, tok, sid, call), post(t, srv, tok, sid, call)
	idOf := func(s string) string {
		_, rest, _ := strings.Cut(s, `"io.toolgate/invocation-id":"`)
		id, _, _ := strings.Cut(rest, `"`)
		return id
	}
	if idOf(a) == "" || idOf(a) != idOf(b) {
		t.Fatalf("retry gave invocations %q and %q", idOf(a), idOf(b))
	}
	other := post(t, srv, tok, sid, strings.Replace(call, "call-7", "call-8", 1))
	if idOf(other) == idOf(a) {
		t.Errorf("another request id reused invocation %s", idOf(a))
	}
	// The request id is the front end's to pass on, never the client's.
	forged := postWith(t, srv, tok, sid, strings.Replace(call, "call-7", "call-9", 1),
		http.Header{"X-Toolgate-Request-Id": {`"call-7"`}})
	if idOf(forged) == "" || idOf(forged) == idOf(a) {
		t.Errorf("a forged request id header reused invocation %s", idOf(a))
	}
}

// TestCallStream: a call answered at once is one application/json
// response; a call that waits for approval is an event stream carrying the
// approval notice before the result, so a client that never opens the
// standalone GET stream still sees it.
func TestCallStream(t *testing.T) {
	e := newEnv(t)
	tok := mint(t, token.Claims{})
	url := newHTTP(t, e)
	first := post(t, url, tok, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	sid := strings.Fields(first)[2]
	post(t, url, tok, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	call := func(body string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, url+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		req.Header.Set("Mcp-Session-Id", sid)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := call(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t.echo","arguments":{"message":"hi"}}}`)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" || resp.ContentLength != int64(len(body)) ||
		!strings.HasPrefix(body, `{"jsonrpc":"2.0","id":2,"result":`) {
		t.Fatalf("quick call: %s %s (length %d) %s", resp.Status, ct, resp.ContentLength, body)
	}

	o := newObserved()
	c := mcp.NewClient(&mcp.Implementation{Name: "no-get-stream", Version: "1"}, o.options())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url + "/mcp", DisableStandaloneSSE: true,
		HTTPClient: &http.Client{Transport: bearerTransport{tok}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		p := &mcp.CallToolParams{Name: "t.risky", Arguments: map[string]any{}}
		p.SetProgressToken("approval")
		r, err := cs.CallTool(ctx, p)
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	id := e.pendingApproval(o)
	if _, err := e.client.Decide(ctx, api.ApprovalDecision{Tenant: tenant, InvocationID: id, Approve: true,
		DecidedBy: "did:user:reviewer", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r == nil || r.IsError || invocationOf(r) != id {
		t.Fatalf("approved call: %+v", r)
	}
}

// TestAgentBusRegistry: a front end connected as an agent reads the
// registry through its tenant's tools.list and tools.get, and a tool
// registered later reaches it within the interval.
func TestAgentBusRegistry(t *testing.T) {
	e := newEnv(t)
	bus, err := mcpfront.NewAgentBus(e.nc, tenant, 100*time.Millisecond, quiet())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changed := make(chan struct{}, 16)
	if err := bus.WatchTools(ctx, func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	has := func(id string) *tools.Manifest {
		for _, m := range bus.Tools() {
			if m.ID == id {
				return m
			}
		}
		return nil
	}
	if m := has("t.echo"); m == nil || len(m.InputSchema) == 0 || m.Safety.RiskLevel != "low" {
		t.Fatalf("t.echo as read through tools.get: %+v", m)
	}
	e.register(`{"id":"t.later","name":"Later","version":"1.0.0","description":"Registered after the start.","kind":"builtin","builtin":{"function":"noop"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"}}`)
	eventually(t, 10*time.Second, "t.later to reach the agent's registry", func() bool { return has("t.later") != nil })
	select {
	case <-changed:
	default:
		t.Error("the registry changed without a notice")
	}
}
