package node_test

import (
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFSLinksResolvedBeforeGrants: a token granted only public/ cannot reach
// secret/ through a symlink inside public/ with any file builtin, while a
// link that stays inside public/ still works.
func TestFSLinksResolvedBeforeGrants(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	root := t.TempDir()
	for f, body := range map[string]string{"public/sub/ok.txt": "fine", "secret/key.txt": "the secret"} {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"public/link_to_secret": "../secret",
		"public/link_file":      "../secret/key.txt",
		"public/deep":           "sub/../../secret",
		"public/inner":          "sub",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	e.startPipeline(node.Config{Stage: node.StageConfig{Builtins: e.builtins(root)}})
	const tenant = "links"
	c := grant(tenant, "fs.*")
	c.Filesystem = &token.FilesystemGrant{AllowedPaths: []string{"/public"}, Mode: "rw"}
	c.PreApproved = token.Patterns{"fs.write_file"}
	raw := mint(t, c)
	call := func(tool, params string) api.Response {
		return e.invoke(withTok(request(tenant, tool, params), raw))
	}
	attacks := []struct{ tool, params string }{
		{"fs.read_file", `{"path":"public/link_to_secret/key.txt"}`},
		{"fs.read_file", `{"path":"public/link_file"}`},
		{"fs.read_file", `{"path":"public/deep/key.txt"}`},
		{"fs.stat", `{"path":"public/link_file"}`},
		{"fs.stat", `{"path":"public/link_to_secret"}`},
		{"fs.append_file", `{"path":"public/link_file","content":"owned"}`},
		{"fs.append_file", `{"path":"public/link_to_secret/new.txt","content":"owned"}`},
		{"fs.list_dir", `{"path":"public/link_to_secret"}`},
		{"fs.write_file", `{"path":"public/link_to_secret/key.txt","content":"owned"}`},
		{"fs.write_file", `{"path":"public/link_to_secret/made/new.txt","content":"owned","create_dirs":true}`},
	}
	for _, a := range attacks {
		t.Run(a.tool+" "+a.params, func(t *testing.T) {
			e.t = t
			resp := call(a.tool, a.params)
			expectDenied(t, resp, api.StatusPermissionDenied, api.EFilesystemDenied)
			if strings.Contains(string(resp.Result), "secret") {
				t.Fatalf("result leaked: %s", resp.Result)
			}
		})
	}
	e.t = t
	if b, _ := os.ReadFile(filepath.Join(root, "secret/key.txt")); string(b) != "the secret" {
		t.Fatalf("secret/key.txt changed: %q", b)
	}
	for _, f := range []string{"secret/new.txt", "secret/made"} {
		if _, err := os.Lstat(filepath.Join(root, f)); err == nil {
			t.Fatalf("%s was created through a link", f)
		}
	}
	// A link that stays inside the grant resolves as before.
	if resp := call("fs.read_file", `{"path":"public/inner/ok.txt"}`); resp.Status != api.StatusSuccess ||
		!strings.Contains(string(resp.Result), "fine") {
		t.Fatalf("link inside the grant: %s %s %s", resp.Status, resp.Result, mustJSON(t, resp.Error))
	}
	if resp := call("fs.write_file", `{"path":"public/inner/w.txt","content":"x"}`); resp.Status != api.StatusSuccess {
		t.Fatalf("write through a link inside the grant: %s %s", resp.Status, mustJSON(t, resp.Error))
	}
	if b, err := os.ReadFile(filepath.Join(root, "public/sub/w.txt")); err != nil || string(b) != "x" {
		t.Fatalf("public/sub/w.txt: %q %v", b, err)
	}
}
