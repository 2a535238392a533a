package mcpfront_test

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/mcpfront"
	"github.com/toolgate/toolgate/internal/token"
)

// tsSDK is the TypeScript MCP SDK that `make mcp-servers` installs with
// the Inspector (its ESM build), or "" when it is not installed.
func tsSDK(t *testing.T) string {
	dir := cmp.Or(os.Getenv("TOOLGATE_MCP_SERVERS"), filepath.Join("..", "..", ".cache", "mcp-servers"))
	p, err := filepath.Abs(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "dist", "esm"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(p, "client", "index.js")); err != nil {
		return ""
	}
	return p
}

// tsClientScript makes two calls that wait for approval with the
// TypeScript SDK's client: the first with resetTimeoutOnProgress, which
// must outlive its timeout for as long as toolgate keeps sending progress;
// the second without, which gives up at its timeout and cancels. It then
// waits for a line on stdin, makes one more request, and reports every
// error the client saw (a response to a cancelled request is one).
const tsClientScript = `
import { Client } from "SDK/client/index.js";
import { StreamableHTTPClientTransport } from "SDK/client/streamableHttp.js";
import readline from "node:readline";
const [url, tok, timeout] = process.argv.slice(2);
const say = (o) => console.log(JSON.stringify(o));
const errors = [];
const client = new Client({ name: "ts-test", version: "1" });
client.onerror = (e) => { errors.push(String(e)); say({ event: "error", error: String(e) }); };
await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { Authorization: "Bearer " + tok } } }));
const lines = readline.createInterface({ input: process.stdin });
const next = () => new Promise((r) => lines.once("line", r));
let n = 0;
const r1 = await client.callTool({ name: "t.risky", arguments: {} }, undefined,
  { timeout: +timeout, resetTimeoutOnProgress: true, onprogress: (p) => say({ event: "progress", call: 1, n: ++n, message: p.message }) });
say({ event: "result", call: 1, isError: !!r1.isError });
try {
  await client.callTool({ name: "t.risky", arguments: {} }, undefined,
    { timeout: +timeout, onprogress: (p) => say({ event: "progress", call: 2, message: p.message }) });
  say({ event: "result", call: 2 });
} catch (e) {
  say({ event: "gaveup", call: 2, error: String(e) });
}
await next();
await client.listTools();
say({ event: "done", errors });
await client.close();
process.exit(0);
`

type tsEvent struct {
	Event   string   `json:"event"`
	Call    int      `json:"call"`
	N       int      `json:"n"`
	Message string   `json:"message"`
	IsError bool     `json:"isError"`
	Error   string   `json:"error"`
	Errors  []string `json:"errors"`
}

// TestTypeScriptClientWaitsForApproval (--wait-approval): with resetTimeoutOnProgress, the
// TypeScript SDK's client waits for an approval well past its request
// timeout, kept alive by toolgate's steady progress; without, it gives up
// at its timeout, toolgate withdraws the approval (audited as cancelled)
// and sends no response the client would report as unknown.
func TestTypeScriptClientWaitsForApproval(t *testing.T) {
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
		StatusInterval: 50 * time.Millisecond, ProgressInterval: 200 * time.Millisecond, WaitApproval: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(front.Handler())
	defer srv.Close()

	const timeoutMS = 1000
	stdin, events, stderr := runTSClient(t, sdk, tsClientScript, srv.URL+"/mcp", mint(t, token.Claims{}), timeoutMS)
	// next returns the next event that satisfies ok.
	next := func(what string, ok func(tsEvent) bool) tsEvent {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case ev, open := <-events:
				if !open {
					t.Fatalf("the client ended before %s\n%s", what, stderr.String())
				}
				if ev.Event == "error" {
					t.Errorf("client error: %s", ev.Error)
				}
				if ok(ev) {
					return ev
				}
			case <-deadline:
				t.Fatalf("timed out waiting for %s\n%s", what, stderr.String())
			}
		}
	}
	invocation := func(msg string) string {
		_, rest, _ := strings.Cut(msg, "(invocation ")
		id, _, _ := strings.Cut(rest, ")")
		return id
	}

	first := next("the first call's approval notice", func(ev tsEvent) bool {
		return ev.Call == 1 && strings.Contains(ev.Message, "waiting for a human to approve")
	})
	id := invocation(first.Message)
	start := time.Now()
	// Past three times the client's timeout, progress still arriving.
	next("progress well past the client's timeout", func(ev tsEvent) bool {
		return ev.Call == 1 && ev.Event == "progress" && time.Since(start) > 3*timeoutMS*time.Millisecond
	})
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	if _, err := e.client.Decide(dctx, api.ApprovalDecision{Tenant: tenant, InvocationID: id, Approve: true, DecidedBy: "did:user:reviewer"}); err != nil {
		t.Fatal(err)
	}
	if ev := next("the first call's result", func(ev tsEvent) bool { return ev.Event == "result" || ev.Event == "gaveup" }); ev.Event != "result" || ev.Call != 1 || ev.IsError {
		t.Fatalf("first call: %+v", ev)
	}

	second := next("the second call's approval notice", func(ev tsEvent) bool {
		return ev.Call == 2 && strings.Contains(ev.Message, "waiting for a human to approve")
	})
	id2 := invocation(second.Message)
	if ev := next("the second call to give up", func(ev tsEvent) bool { return ev.Call == 2 && ev.Event != "progress" }); ev.Event != "gaveup" {
		t.Fatalf("second call: %+v", ev)
	}
	eventually(t, 15*time.Second, "the approval withdrawn", func() bool {
		a, err := e.client.Approval(dctx, tenant, id2)
		return err == nil && a.State == api.ApprovalCancelled
	})
	if ev := e.audited(id2); ev["status"] != string(api.StatusCancelled) {
		t.Errorf("audit of the withdrawn call: %v", ev)
	}
	if _, err := stdin.Write([]byte("go on\n")); err != nil {
		t.Fatal(err)
	}
	if ev := next("the client's report", func(ev tsEvent) bool { return ev.Event == "done" }); len(ev.Errors) != 0 {
		t.Fatalf("the client saw errors: %v", ev.Errors)
	}
}

// runTSClient runs script (its SDK/ imports pointed at sdk) with node,
// against url as the holder of tok, with timeoutMS as the client's request
// timeout, until the test ends. It returns the client's stdin, the events
// it reports on stdout, and its stderr.
func runTSClient(t *testing.T, sdk, script, url, tok string, timeoutMS int) (io.Writer, <-chan tsEvent, *strings.Builder) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "client.mjs")
	if err := os.WriteFile(file, []byte(strings.ReplaceAll(script, "SDK/", "file://"+sdk+"/")), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "node", file, url, tok, strconv.Itoa(timeoutMS))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &strings.Builder{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	events := make(chan tsEvent, 256)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev tsEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				events <- ev
			}
		}
		close(events)
	}()
	return stdin, events, stderr
}
