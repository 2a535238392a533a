package mcpfront_test

import (
	"context"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/mcpfront"
	"github.com/toolgate/toolgate/internal/token"
)

// tsParkedScript calls a tool that waits for approval with the TypeScript
// SDK's client and a request timeout, without resetTimeoutOnProgress; once
// told on stdin that the call is decided, it asks toolgate_status.
const tsParkedScript = `
import { Client } from "SDK/client/index.js";
import { StreamableHTTPClientTransport } from "SDK/client/streamableHttp.js";
import readline from "node:readline";
const [url, tok, timeout] = process.argv.slice(2);
const say = (o) => console.log(JSON.stringify(o));
const client = new Client({ name: "ts-parked", version: "1" });
await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { Authorization: "Bearer " + tok } } }));
const lines = readline.createInterface({ input: process.stdin });
const next = () => new Promise((r) => lines.once("line", r));
let id = "";
try {
  const r = await client.callTool({ name: "t.risky", arguments: {} }, undefined, { timeout: +timeout });
  id = r._meta["io.toolgate/invocation-id"];
  say({ event: "parked", isError: !!r.isError, message: r.content[0].text, error: id });
} catch (e) {
  say({ event: "gaveup", error: String(e) });
  process.exit(0);
}
await next();
const s = await client.callTool({ name: "toolgate_status", arguments: { invocation_id: id, wait_seconds: 20 } }, undefined, { timeout: 30000 });
say({ event: "status", isError: !!s.isError, message: s.content[0].text, error: s._meta["io.toolgate/invocation-id"] });
await client.close();
process.exit(0);
`

// TestTypeScriptClientParkedCall: the TypeScript SDK's client, with a
// request timeout shorter than the approval takes and no
// resetTimeoutOnProgress, gets the parked call's answer in time; the call
// stays parked past that timeout, is approved, and toolgate_status
// returns its result.
func TestTypeScriptClientParkedCall(t *testing.T) {
	sdk := tsSDK(t)
	if sdk == "" {
		t.Skip("the TypeScript MCP SDK is not installed (make mcp-servers installs it with the Inspector)")
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("no node")
	}
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	front, err := mcpfront.Start(ctx, mcpfront.Config{Bus: busOf(t, e), Verifier: verifier(), Log: quiet(),
		StatusInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(front.Handler())
	defer srv.Close()
	const timeoutMS = 3000
	stdin, events, stderr := runTSClient(t, sdk, tsParkedScript, srv.URL+"/mcp", mint(t, token.Claims{}), timeoutMS)
	next := func(what string) tsEvent {
		t.Helper()
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("the client ended before %s\n%s", what, stderr.String())
			}
			return ev
		case <-time.After(40 * time.Second):
			t.Fatalf("timed out waiting for %s\n%s", what, stderr.String())
		}
		return tsEvent{}
	}
	parked := next("the parked call's answer")
	id := parked.Error
	if parked.Event != "parked" || parked.IsError || id == "" || !strings.Contains(parked.Message, mcpfront.StatusTool) {
		t.Fatalf("the parked call: %+v", parked)
	}
	// Past the client's timeout the call is still parked, not withdrawn.
	time.Sleep(timeoutMS*time.Millisecond + time.Second)
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	if a, err := e.client.Approval(dctx, tenant, id); err != nil || a.State != api.ApprovalPending {
		t.Fatalf("approval of %s past the client's timeout: %+v %v", id, a, err)
	}
	if _, err := e.client.Decide(dctx, api.ApprovalDecision{Tenant: tenant, InvocationID: id, Approve: true, DecidedBy: "did:user:reviewer"}); err != nil {
		t.Fatal(err)
	}
	if _, err := stdin.Write([]byte("decided\n")); err != nil {
		t.Fatal(err)
	}
	if st := next("toolgate_status"); st.Event != "status" || st.IsError || st.Error != id || strings.Contains(st.Message, "has not ended") {
		t.Fatalf("toolgate_status after the approval: %+v", st)
	}
}
