package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages/execute/mcptool"
	"github.com/toolgate/toolgate/stages/execute/mcptool/mcptest"
	"github.com/toolgate/toolgate/subjects"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// mcpPipeline runs the whole pipeline with root as the file root of
// sandboxed tools and quick MCP restarts.
func mcpPipeline(t *testing.T, root string) (*env, *node.Node) {
	t.Helper()
	if err := sandbox.Available(); err != nil {
		t.Fatalf("MCP stdio servers need bubblewrap and prlimit (.ci/run installs them): %v", err)
	}
	e := newEnv(t, topology.TopologyOptions{})
	cfg := node.Config{}
	cfg.Stage.Sandbox.FileRoot = root
	cfg.Stage.Sandbox.ReadOnlyRoots = mcptest.Roots(t)
	cfg.Stage.MCP.Backoff = mcptool.Backoff{Min: 200 * time.Millisecond, Max: 2 * time.Second}
	return e, e.startPipeline(cfg)
}

// mcpManifest is a manifest of kind mcp; extra is spliced into the top level.
func mcpManifest(t *testing.T, id string, spec mcptool.Spec, extra string) string {
	t.Helper()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`{"id":%q,"name":%q,"version":"1.0.0","description":"test","kind":"mcp","mcp":%s,
		"input_schema":{"type":"object"},"output_schema":{"type":"object"}%s}`, id, spec.Tool, raw, extra)
}

func wantError(t *testing.T, resp api.Response, status api.Status, ecode string) {
	t.Helper()
	if resp.Status != status || resp.Error == nil || resp.Error.ECode != ecode {
		t.Fatalf("got %s %s, want %s %s", resp.Status, mustJSON(t, resp.Error), status, ecode)
	}
}

// TestMCPEverything: tools of the reference server-everything, started in
// the sandbox on first use, answer through the whole pipeline.
func TestMCPEverything(t *testing.T) {
	script, modules := mcptest.Everything(t)
	e, n := mcpPipeline(t, t.TempDir())
	spec := mcptool.Spec{Server: "everything", Command: []string{"node", script, "stdio"}, ReadOnlyPaths: []string{modules}}
	spec.Tool = "echo"
	echo := mcpManifest(t, "mcp:everything:echo", spec, "")
	spec.Tool = "get-sum"
	sum := mcpManifest(t, "mcp:everything:get-sum", spec, "")
	registerTools(t, n, echo, sum)

	resp := e.invoke(request("mcpe", "mcp:everything:echo", `{"message":"hi through toolgate"}`))
	if resp.Status != api.StatusSuccess || !strings.Contains(string(resp.Result), "hi through toolgate") {
		t.Fatalf("echo: %s %s %s", resp.Status, resp.Result, mustJSON(t, resp.Error))
	}
	resp = e.invoke(request("mcpe", "mcp:everything:get-sum", `{"a":2,"b":40}`))
	if resp.Status != api.StatusSuccess || !strings.Contains(string(resp.Result), "42") {
		t.Fatalf("get-sum: %s %s %s", resp.Status, resp.Result, mustJSON(t, resp.Error))
	}
	if resp.ExecutionMetadata == nil || resp.ExecutionMetadata.ToolID != "mcp:everything:get-sum" {
		t.Fatalf("metadata %s", mustJSON(t, resp.ExecutionMetadata))
	}
}

// TestMCPFilesystemConfinement: server-filesystem, whose allowed directory
// is a granted directory, writes inside it, and neither .. nor a symlink
// gets a write outside it; the host files stay untouched.
func TestMCPFilesystemConfinement(t *testing.T) {
	script, modules := mcptest.Filesystem(t)
	root := mcptest.Shared(t, t.TempDir())
	outside := mcptest.Shared(t, t.TempDir())
	data := filepath.Join(root, "data")
	if err := os.Mkdir(data, 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(data, 0o777) // the server runs as nobody when the test runs as root
	secret := filepath.Join(outside, "secret.txt")
	if err := os.WriteFile(secret, []byte("secret"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(data, "link")); err != nil {
		t.Fatal(err)
	}
	e, n := mcpPipeline(t, root)
	spec := mcptool.Spec{Server: "fs", Tool: "write_file", Command: []string{"node", script, "/files/data"},
		ReadOnlyPaths: []string{modules}}
	registerTools(t, n, mcpManifest(t, "mcp:fs:write_file", spec,
		`,"safety":{"side_effects":["fs.write"]},"permissions":{"filesystem":[{"path":"data","mode":"rw"}]}`))

	resp := e.invoke(request("mcpfs", "mcp:fs:write_file", `{"path":"/files/data/ok.txt","content":"written"}`))
	if resp.Status != api.StatusSuccess {
		t.Fatalf("write inside: %s %s", resp.Status, mustJSON(t, resp.Error))
	}
	if b, err := os.ReadFile(filepath.Join(data, "ok.txt")); err != nil || string(b) != "written" {
		t.Fatalf("host file: %q %v", b, err)
	}
	for _, p := range []string{"/files/data/../escape.txt", "/files/data/link/secret.txt", "/files/data/link/new.txt",
		"/files/data/../../" + strings.TrimPrefix(secret, "/")} {
		resp := e.invoke(request("mcpfs", "mcp:fs:write_file", fmt.Sprintf(`{"path":%q,"content":"pwned"}`, p)))
		if resp.Status == api.StatusSuccess {
			t.Fatalf("write to %s succeeded: %s", p, resp.Result)
		}
		if resp.Error == nil || resp.Error.ECode != api.EToolFailed {
			t.Fatalf("write to %s: %s %s", p, resp.Status, mustJSON(t, resp.Error))
		}
	}
	if b, _ := os.ReadFile(secret); string(b) != "secret" {
		t.Fatalf("the file outside was changed: %q", b)
	}
	for _, f := range []string{filepath.Join(root, "escape.txt"), filepath.Join(outside, "new.txt")} {
		if _, err := os.Stat(f); err == nil {
			t.Fatalf("%s was created", f)
		}
	}
}

// TestMCPMisbehavingServer: a server that crashes mid-call ends that call
// with E3121 and its audit events, and serves the next call after its
// restart; a call that hangs times out (E3103) and the worker serves the
// next one; a result with a field of the wrong type is stopped by verify
// (E3507).
func TestMCPMisbehavingServer(t *testing.T) {
	bin := mcptest.Flaky(t)
	e, n := mcpPipeline(t, t.TempDir())
	spec := func(tool string) mcptool.Spec {
		return mcptool.Spec{Server: "flaky", Tool: tool, Command: []string{bin}, ReadOnlyPaths: []string{filepath.Dir(bin)}}
	}
	registerTools(t, n,
		mcpManifest(t, "mcp:flaky:crash", spec("crash"), ""),
		// Retries ride over the restart: a call refused while the server is
		// down did not start, so it is safe to retry.
		mcpManifest(t, "mcp:flaky:whoami", spec("whoami"), `,"retry_policy":{"max_attempts":8,"base_delay_ms":300,"max_delay_ms":1000}`),
		mcpManifest(t, "mcp:flaky:hang", spec("hang"), `,"limits":{"timeout_ms":1500}`),
		mcpManifest(t, "mcp:flaky:echo", spec("echo"), ""),
		strings.Replace(mcpManifest(t, "mcp:flaky:bad_output", spec("bad_output"), ""), `"output_schema":{"type":"object"}`,
			`"output_schema":{"type":"object","required":["answer"],"properties":{"answer":{"type":"integer"}}}`, 1),
	)
	const tenant = "mcpcrash"
	first := e.invoke(request(tenant, "mcp:flaky:whoami", `{}`))
	if first.Status != api.StatusSuccess {
		t.Fatalf("whoami: %s %s", first.Status, mustJSON(t, first.Error))
	}
	resp := e.invoke(request(tenant, "mcp:flaky:crash", `{}`))
	wantError(t, resp, api.StatusError, api.EMCPServerExited)
	if !strings.Contains(resp.Error.Message, "exit status 3") {
		t.Fatalf("crash message: %s", resp.Error.Message)
	}
	events := e.auditOf(tenant, 4)
	if events[2].Type() != api.TypeInvoked || events[3].Type() != api.TypeFailed {
		t.Fatalf("audit of the crash: %s, %s", events[2].Type(), events[3].Type())
	}
	again := e.invoke(request(tenant, "mcp:flaky:whoami", `{}`))
	if again.Status != api.StatusSuccess {
		t.Fatalf("whoami after the crash: %s %s", again.Status, mustJSON(t, again.Error))
	}
	if string(again.Result) == string(first.Result) {
		t.Fatalf("the same server process answered after a crash: %s", again.Result)
	}

	start := time.Now()
	resp = e.invoke(request(tenant, "mcp:flaky:hang", `{}`))
	wantError(t, resp, api.StatusTimeout, api.ETimeout)
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the hang took %v to time out", d)
	}
	resp = e.invoke(request(tenant, "mcp:flaky:echo", `{"text":"after the hang"}`))
	if resp.Status != api.StatusSuccess || !strings.Contains(string(resp.Result), "after the hang") {
		t.Fatalf("echo after the hang: %s %s", resp.Status, mustJSON(t, resp.Error))
	}

	// A field of the wrong type, and nothing else: the specification's E3507.
	resp = e.invoke(request(tenant, "mcp:flaky:bad_output", `{}`))
	wantError(t, resp, api.StatusError, api.EResultFieldType)
	if resp.Result != nil {
		t.Fatalf("a result failing its schema was passed on: %s", resp.Result)
	}
}

// TestMCPImportRegisters: import-mcp's manifests register through the
// control service under ids mcp:<server>:<tool> (colons escaped in KV keys),
// carry the operator's risk, not the server's claims, and run.
func TestMCPImportRegisters(t *testing.T) {
	bin := mcptest.Flaky(t)
	e, _ := mcpPipeline(t, t.TempDir())
	k := mcptool.New(mcptool.Config{Sandbox: sandbox.Config{ReadOnlyRoots: mcptest.Roots(t)}})
	defer k.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	docs, err := k.Manifests(ctx, mcptool.Import{Server: "flaky", Command: []string{bin}, ReadOnlyPaths: []string{filepath.Dir(bin)},
		Risk: "low", SideEffects: []string{"fs.delete"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if _, err := e.client.RegisterTool(ctx, d, false); err != nil {
			t.Fatalf("%v\n%s", err, d)
		}
	}
	raw, err := e.client.GetTool(ctx, "mcp:flaky:wipe_everything", "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := tools.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != "mcp:flaky:wipe_everything" || got.Safety.RiskLevel != "low" || got.Safety.Idempotent ||
		len(got.Safety.SideEffects) != 1 || got.Safety.SideEffects[0] != "fs.delete" {
		t.Fatalf("imported manifest: %s", mustJSON(t, got))
	}
	// KV keys cannot hold ':': the id is stored escaped, reads back whole,
	// the registry of every worker resolves it, and the tool runs.
	kv, err := e.js.KeyValue(ctx, kvstore.BucketTools)
	if err != nil {
		t.Fatal(err)
	}
	key := subjects.Token("mcp:flaky:wipe_everything") + "." + subjects.Token(got.Version)
	if _, err := kv.Get(ctx, key); err != nil {
		t.Fatalf("tools bucket key %s: %v", key, err)
	}
	if back, err := subjects.Untoken(subjects.Token(got.ID)); err != nil || back != got.ID {
		t.Fatalf("id round trip: %q %v", back, err)
	}
	var resp api.Response
	eventually(t, 10*time.Second, "the imported tool to reach the workers", func() bool {
		resp = e.invoke(request("mcpimp", "mcp:flaky:echo", `{"text":"imported"}`))
		return resp.Status == api.StatusSuccess
	})
	if !strings.Contains(string(resp.Result), "imported") {
		t.Fatalf("imported echo: %s", resp.Result)
	}
}
