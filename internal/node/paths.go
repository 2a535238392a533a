package node

import (
	"errors"
	"io/fs"

	"github.com/toolgate/toolgate/api"
	"path/filepath"
	"strings"
)

// resolvePaths makes the paths tools and the sandbox get absolute, so a
// relative --file-root means the same directory to os.Root and to bwrap
// (which runs in a private directory), and refuses a file root from which
// tools would reach toolgate's own state.
func resolvePaths(c *Config) error {
	for _, p := range []*string{&c.Stage.BuiltinEnv.FileRoot, &c.Stage.Sandbox.FileRoot, &c.Stage.Sandbox.WorkDir,
		&c.Stage.SecretsDir, &c.DevKeyDir, &c.Embedded.DataDir, &c.JWKSPath} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		*p = abs
	}
	data := c.Embedded.DataDir
	if c.NATSURL != "" && !c.Examples {
		data = "" // unused: no embedded server, no development key
	}
	private := map[string]string{"data directory (--data)": data, "development key directory": c.DevKeyDir,
		"secrets directory (--secrets-dir)": c.Stage.SecretsDir}
	for _, root := range []string{c.Stage.BuiltinEnv.FileRoot, c.Stage.Sandbox.FileRoot} {
		if root == "" {
			continue
		}
		r := realPath(root)
		for what, dir := range private {
			if dir == "" {
				continue
			}
			if d := realPath(dir); within(r, d) || within(d, r) {
				return api.NewError(api.PermissionDenied, api.EUnsafeFileRoot,
					"file root %s overlaps the %s %s: tools would reach toolgate's own state; choose a file root apart from it (make run uses examples/files)",
					root, what, dir).WithDetail("file_root", root).WithDetail("path", dir)
			}
		}
	}
	return nil
}

// realPath resolves the symlinks of p's longest existing prefix, so a
// directory not made yet still compares right.
func realPath(p string) string {
	r, err := filepath.EvalSymlinks(p)
	if err == nil {
		return r
	}
	parent := filepath.Dir(p)
	if !errors.Is(err, fs.ErrNotExist) || parent == p {
		return p
	}
	return filepath.Join(realPath(parent), filepath.Base(p))
}

// within reports whether p is dir or below it, by whole path components.
func within(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../") && !filepath.IsAbs(rel)
}
