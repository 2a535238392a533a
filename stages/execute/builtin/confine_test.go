package builtin

import (
	"context"
	"errors"
	"github.com/toolgate/toolgate/api"
	"os"
	"path/filepath"
	"testing"
)

func TestResolveIn(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"public/sub", "secret"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"public/up": "../secret", "public/abs": "/etc", "public/out": "../../x",
		"public/loop": "loop", "public/chain": "up", "public/in": "sub",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for in, want := range map[string]string{
		"public/up/k": "secret/k", "public/chain/k": "secret/k", "public/in/new/f": "public/sub/new/f",
		".": ".", "public/sub/..": "public", "public/missing/../in": "public/sub",
	} {
		if got, err := resolveIn(r, in); err != nil || got != want {
			t.Errorf("resolveIn(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"public/abs/passwd", "public/out", ".."} {
		if _, err := resolveIn(r, in); !errors.Is(err, errLeaves) {
			t.Errorf("resolveIn(%q): %v, want errLeaves", in, err)
		}
	}
	if _, err := resolveIn(r, "public/loop"); err == nil {
		t.Error("a symlink loop resolved")
	}
	// Grants in the context: the resolved path decides.
	ctx := WithGrants(context.Background(), []string{"/public"})
	if _, _, err := confine(ctx, root, "stat", "public/up"); api.AsError(err).ECode != api.EFilesystemDenied {
		t.Errorf("public/up under a /public grant: %v", err)
	}
	sub, at, err := confine(ctx, root, "stat", "public/in")
	if err != nil || at != "sub" {
		t.Fatalf("public/in: %q %v", at, err)
	}
	sub.Close()
}
