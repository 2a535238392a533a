package node_test

import (
	"context"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestPathSpellings: grants and path parameters are relative to the file
// root, and a leading slash means the same as none, in both places.
func TestPathSpellings(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "public"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "public", "readme.txt"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "private.txt"), []byte("no"), 0o644); err != nil {
		t.Fatal(err)
	}
	n := e.startPipeline(node.Config{Stage: node.StageConfig{Builtins: e.builtins(root)}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, id := range []string{"fs.read_file", "fs.stat"} {
		if err := n.WaitForTool(ctx, id, "1.0.0"); err != nil {
			t.Fatal(err)
		}
	}
	const tenant = "paths"
	for _, g := range []string{"public", "/public", "public/", "./public"} {
		c := grant(tenant, "fs.*")
		c.Filesystem = &token.FilesystemGrant{AllowedPaths: []string{g}, Mode: "ro"}
		tok := mint(t, c)
		for _, p := range []string{"public/readme.txt", "/public/readme.txt", "./public/readme.txt"} {
			t.Run(g+"|"+p, func(t *testing.T) {
				for _, tool := range []string{"fs.read_file", "fs.stat"} {
					resp := e.invoke(withTok(request(tenant, tool, `{"path":"`+p+`"}`), tok))
					if resp.Status != api.StatusSuccess {
						t.Fatalf("%s: %s %s", tool, resp.Status, mustJSON(t, resp.Error))
					}
				}
			})
		}
		for _, p := range []string{"private.txt", "/private.txt", "publicity.txt"} {
			expectDenied(t, e.invoke(withTok(request(tenant, "fs.read_file", `{"path":"`+p+`"}`), tok)),
				api.StatusPermissionDenied, api.EFilesystemDenied)
		}
	}
}
