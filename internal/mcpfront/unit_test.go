package mcpfront

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
)

func TestToolName(t *testing.T) {
	for id, want := range map[string]string{
		"echo": "echo", "text.word_count": "text.word_count", "mcp:fs:write_file": "mcp_fs_write_file", "a b/c": "a_b_c",
	} {
		if got := ToolName(id); got != want {
			t.Errorf("ToolName(%q) = %q, want %q", id, got, want)
		}
	}
}

// TestEnvelope: a call's id and method are read once; its id is written
// as the SDK tells requests apart; notifications, batches and anything that
// is not JSON are left to the SDK.
func TestEnvelope(t *testing.T) {
	m, ok := parseEnvelope([]byte(`{"jsonrpc":"2.0","id":"r-1","method":"tools/call","params":{"name":"x","_meta":{"progressToken":3}}}`))
	if !ok || *m.Method != "tools/call" || m.unknown() {
		t.Fatalf("parsed %+v %v", m, ok)
	}
	if m, ok := parseEnvelope([]byte(`{"jsonrpc":"2.0","id":2,"method":"tools/destroy"}`)); !ok || !m.unknown() {
		t.Errorf("unknown method: %+v %v", m, ok)
	}
	for _, in := range []string{
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":null,"method":"tools/call"}`,
		`[{"jsonrpc":"2.0","id":1,"method":"tools/call"}]`,
		`{"jsonrpc":"2.0","id":1,"result":{}}`,
		`not json`,
	} {
		if m, ok := parseEnvelope([]byte(in)); ok {
			t.Errorf("parseEnvelope(%s) = %+v", in, m)
		}
	}
	for in, want := range map[string]string{`"r-1"`: `"r-1"`, ` 7 `: `7`, `7.0`: `7`, `"7"`: `"7"`, `"<&>"`: `"\u003c\u0026\u003e"`} {
		if got, ok := canonicalID(json.RawMessage(in)); !ok || got != want {
			t.Errorf("canonicalID(%s) = %s, %v; want %s", in, got, ok, want)
		}
	}
	for _, in := range []string{`{}`, `[1]`, `true`, `x`} {
		if got, ok := canonicalID(json.RawMessage(in)); ok {
			t.Errorf("canonicalID(%s) = %s", in, got)
		}
	}
}

func TestInvocationIDIsStablePerSessionAndRequest(t *testing.T) {
	a, b := invocationID("s1", `"7"`), invocationID("s1", `"7"`)
	if a != b || a == invocationID("s2", `"7"`) || a == invocationID("s1", `7`) {
		t.Errorf("ids %s %s", a, b)
	}
	// The name hashed is the session id and the request id as JSON.
	if want := uuid.NewSHA1(uuid.NameSpaceURL, []byte(`urn:toolgate:mcp:s1:"7"`)).String(); a != want {
		t.Errorf("invocation %s, want %s", a, want)
	}
	if x, y := invocationID("s1", ""), invocationID("s1", ""); x == y {
		t.Error("requests without an id share an invocation")
	}
}

// TestAdvice: every refusal tells the model what to do, by code.
func TestAdvice(t *testing.T) {
	for _, e := range []*api.Error{
		api.NewError(api.PermissionDenied, api.ENotGranted, "x"),
		api.NewError(api.PermissionDenied, api.EApprovalDenied, "x"),
		api.NewError(api.RateLimitExceeded, api.ERateLimited, "x").WithDetail("retry_after_ms", 250),
		api.NewError(api.ToolExecutionError, api.EToolFailed, "x"),
	} {
		r := errorResult("inv", e)
		if !r.IsError || advise(e) == "" || r.Meta[MetaInvocationID] != "inv" {
			t.Errorf("%s: %+v", e.ECode, r)
		}
	}
	if got := advise(api.NewError(api.RateLimitExceeded, api.ERateLimited, "x").WithDetail("retry_after_ms", 250)); got != "Wait about 250 ms, then try again." {
		t.Errorf("rate limit advice %q", got)
	}
}

func TestGrantsHonoursExcludedSideEffects(t *testing.T) {
	c := &token.Claims{ToolID: token.Patterns{"t.*"}, TenantID: "a", AgentDID: "d", ExcludedSideEffects: []string{"network"}}
	for _, tc := range []struct {
		id   string
		se   []string
		want bool
	}{
		{"t.a", []string{"network.http"}, false},
		{"t.b", []string{"networking"}, true},
		{"t.c", []string{"fs.write"}, true},
		{"u.d", nil, false},
	} {
		m := &tools.Manifest{ID: tc.id, Version: "1.0.0", Safety: tools.Safety{SideEffects: tc.se}}
		if got := grants(c, m); got != tc.want {
			t.Errorf("%s %v: grants = %v", tc.id, tc.se, got)
		}
	}
}

// TestConnectOptions: an agent's connection presents its token and takes
// replies under its private inbox prefix.
func TestConnectOptions(t *testing.T) {
	c := &token.Claims{TenantID: "acme"}
	c.ID = "tok:1"
	o := nats.GetDefaultOptions()
	for _, opt := range ConnectOptions(c, "raw-token") {
		if err := opt(&o); err != nil {
			t.Fatal(err)
		}
	}
	if o.Token != "raw-token" || o.InboxPrefix != busauth.InboxPrefix("acme", "tok:1") {
		t.Errorf("token %q, inbox prefix %q", o.Token, o.InboxPrefix)
	}
	o = nats.GetDefaultOptions()
	for _, opt := range ConnectOptions(nil, "") {
		_ = opt(&o)
	}
	if o.Token != "" || o.InboxPrefix != "" {
		t.Errorf("without a token: token %q, inbox prefix %q", o.Token, o.InboxPrefix)
	}
}

// FuzzEnvelope: what the front end reads of a POST body (the method it may
// answer for itself, the id a call is invoked under) agrees with the SDK's
// own decoding of the same body, which serves the request.
func FuzzEnvelope(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":"r-1","method":"tools/call","params":{"name":"x"}}`,
		`{"jsonrpc":"2.0","id":7.9,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":-0,"method":"initialize","params":{}}`,
		`{"jsonrpc":"2.0","id":"\ud800","method":"tools/call"}`,
		`{"jsonrpc":"2.0","ID":1,"Method":"tools/call","method":"ping"}`,
		`{"jsonrpc":"2.0","id":1e300,"method":"tools/call"}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`[{"jsonrpc":"2.0","id":1,"method":"tools/call"}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		m, ok := parseEnvelope(body)
		if !ok {
			return // the SDK alone reads it
		}
		if m.Method == nil || len(m.ID) == 0 {
			t.Fatalf("parsed %s as %+v", body, m)
		}
		msg, err := jsonrpc.DecodeMessage(body)
		if err != nil {
			return // the SDK refuses it, whatever the front end read
		}
		req, isReq := msg.(*jsonrpc.Request)
		if !isReq || !req.ID.IsValid() {
			t.Fatalf("the front end read a call in %s; the SDK read %#v", body, msg)
		}
		if req.Method != *m.Method {
			t.Fatalf("method of %s: front end %q, SDK %q", body, *m.Method, req.Method)
		}
		id, ok := canonicalID(m.ID)
		var want string
		switch v := req.ID.Raw().(type) {
		case string:
			b, _ := json.Marshal(v)
			want = string(b)
		case int64:
			want = strconv.FormatInt(v, 10)
		}
		if !ok || id != want {
			t.Fatalf("id of %s: front end %s (%v), SDK %s", body, id, ok, want)
		}
	})
}

// TestReadToolsAreNotDestructive: the shipped file tools that only read
// (their side effect is fs.read) are read-only and not destructive; those
// that write are destructive.
func TestReadToolsAreNotDestructive(t *testing.T) {
	ms, err := tools.Examples()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"fs.read_file": true, "fs.stat": true, "fs.list_dir": true, "fs.write_file": false, "fs.append_file": false}
	seen := 0
	for _, m := range ms {
		readOnly, ok := want[m.ID]
		if !ok {
			continue
		}
		seen++
		a := annotations(m)
		if a.ReadOnlyHint != readOnly || *a.DestructiveHint == readOnly {
			t.Errorf("%s (side effects %v): read-only %v, destructive %v; want read-only %v", m.ID, m.Safety.SideEffects,
				a.ReadOnlyHint, *a.DestructiveHint, readOnly)
		}
	}
	if seen != len(want) {
		t.Fatalf("found %d of the %d file tools among the examples", seen, len(want))
	}
}

// TestLiveCalls: a call whose POST's connection closed before the SDK
// started it is cancelled as it starts; one whose POST ended normally is
// forgotten; a running one is cancelled with the connection's cause.
func TestLiveCalls(t *testing.T) {
	var l liveCalls
	l.expect("s 1")
	l.closed("s 1", true)
	ctx, cancel := context.WithCancelCause(context.Background())
	end := l.start("s 1", cancel)
	if !errors.Is(context.Cause(ctx), errConnectionClosed) {
		t.Fatalf("a call dropped before it started: cause %v", context.Cause(ctx))
	}
	end()

	l.expect("s 2")
	ctx, cancel = context.WithCancelCause(context.Background())
	end = l.start("s 2", cancel)
	l.closed("s 2", true)
	if !errors.Is(context.Cause(ctx), errConnectionClosed) {
		t.Fatalf("a running call: cause %v", context.Cause(ctx))
	}
	end()

	l.expect("s 3")
	l.closed("s 3", false)
	ctx, cancel = context.WithCancelCause(context.Background())
	end = l.start("s 3", cancel)
	if ctx.Err() != nil {
		t.Fatal("a call of a POST that ended normally was cancelled")
	}
	end()
	if len(l.m) != 0 {
		t.Fatalf("left behind: %v", l.m)
	}
}
