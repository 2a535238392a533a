package node_test

import (
	"context"
	"encoding/json"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestBuiltinTools runs the example file, parse and math builtins through
// all six stages: a write needs a read-write grant on its path (and, being
// high risk, a pre-approval), and what reaches the tool stays in the root.
func TestBuiltinTools(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	root := t.TempDir()
	n := e.startPipeline(node.Config{Stage: node.StageConfig{Builtins: e.builtins(root)}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, id := range []string{"fs.write_file", "fs.list_dir", "math.eval", "parse.yaml"} {
		if err := n.WaitForTool(ctx, id, "1.0.0"); err != nil {
			t.Fatal(err)
		}
	}
	const tenant = "bt"
	rw := grant(tenant, "fs.*", "math.eval", "parse.*")
	rw.Filesystem = &token.FilesystemGrant{AllowedPaths: []string{"/out"}, Mode: "rw"}
	rw.PreApproved = token.Patterns{"fs.write_file"}
	rwTok := mint(t, rw)
	write := func(tok, p string) api.Response {
		return e.invoke(withTok(request(tenant, "fs.write_file", `{"path":"`+p+`","content":"report","create_dirs":true}`), tok))
	}

	resp := write(rwTok, "out/r.txt")
	if resp.Status != api.StatusSuccess {
		t.Fatalf("write with an rw grant: %s %s", resp.Status, mustJSON(t, resp.Error))
	}
	if b, err := os.ReadFile(filepath.Join(root, "out", "r.txt")); err != nil || string(b) != "report" {
		t.Fatalf("file content %q, %v", b, err)
	}
	list := e.invoke(withTok(request(tenant, "fs.list_dir", `{"path":"out"}`), rwTok))
	if list.Status != api.StatusSuccess || !json.Valid(list.Result) {
		t.Fatalf("list_dir: %s %s", list.Status, mustJSON(t, list.Error))
	}

	// The same grant read-only: authorize refuses, nothing is written.
	ro := rw
	ro.Filesystem = &token.FilesystemGrant{AllowedPaths: []string{"/out"}, Mode: "ro"}
	expectDenied(t, write(mint(t, ro), "out/ro.txt"), api.StatusPermissionDenied, api.EFilesystemDenied)
	// rw, but not on this path.
	expectDenied(t, write(rwTok, "elsewhere.txt"), api.StatusPermissionDenied, api.EFilesystemDenied)
	// A token excluding writes.
	noWrites := rw
	noWrites.ExcludedSideEffects = []string{"fs.write"}
	expectDenied(t, write(mint(t, noWrites), "out/x.txt"), api.StatusPermissionDenied, api.EPolicyDenied)
	// Climbing out is refused before authorize.
	expectDenied(t, write(rwTok, "out/../../x.txt"), api.StatusPermissionDenied, api.EPathOutsideRoots)
	for _, p := range []string{"ro.txt", "elsewhere.txt", "x.txt"} {
		if _, err := os.Stat(filepath.Join(root, "out", p)); err == nil {
			t.Fatalf("refused write created out/%s", p)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "elsewhere.txt")); err == nil {
		t.Fatal("refused write created elsewhere.txt")
	}

	m := e.invoke(withTok(request(tenant, "math.eval", `{"expression":"(2 + 3) * pow(2, 10) / 4"}`), rwTok))
	if m.Status != api.StatusSuccess || string(m.Result) != `{"exact":true,"result":1280}` {
		t.Fatalf("math.eval: %s %s %s", m.Status, m.Result, mustJSON(t, m.Error))
	}
	bad := e.invoke(withTok(request(tenant, "math.eval", `{"expression":"os.Exit(1)"}`), rwTok))
	if bad.Error == nil || bad.Error.Code != api.InvalidParameters || bad.Error.ECode != api.EParametersInvalid {
		t.Fatalf("math.eval of a call: %s %s", bad.Status, mustJSON(t, bad.Error))
	}
	bomb := e.invoke(withTok(request(tenant, "parse.yaml",
		string(mustJSON(t, map[string]any{"text": "a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"}))), rwTok))
	if bomb.Error == nil || bomb.Error.ECode != api.EParameterBounds {
		t.Fatalf("YAML bomb: %s %s", bomb.Status, mustJSON(t, bomb.Error))
	}
}
