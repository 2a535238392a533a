package builtin

import (
	"context"
	"errors"
	"fmt"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/token"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
)

type grantsKey struct{}

// grantSet is the token's granted paths as authorize cleaned them ("/public",
// "/" for the whole root). A context carrying one, even an empty one, makes
// the file builtins check every path against it after resolving symlinks.
type grantSet struct{ paths []string }

// WithGrants returns ctx carrying the paths a capability token grants. The
// execute stage sets it for every authorized call: authorize compared the
// path as written, and a symlink inside the file root (public/link ->
// ../secret) may lead elsewhere, so the file builtins compare again with the
// path every link resolved.
func WithGrants(ctx context.Context, paths []string) context.Context {
	return context.WithValue(ctx, grantsKey{}, grantSet{paths: paths})
}

// maxLinks bounds the symlinks followed while resolving one path, as the
// kernel's ELOOP limit does.
const maxLinks = 40

var errLeaves = errors.New("leaves the file root")

// confine opens the directory under root that a call on rel (RootRelative's
// form) may touch and returns it with rel relative to it. Without grants in
// ctx that is the file root itself. With grants, rel is resolved inside the
// root (every symlink followed), the grant holding the resolved path is
// found, and an os.Root is opened at that granted directory: the operation
// then cannot leave it, even if a link is swapped in meanwhile.
func confine(ctx context.Context, root, tool, rel string) (*os.Root, string, error) {
	r, err := openRoot(root, tool)
	if err != nil {
		return nil, "", err
	}
	g, ok := ctx.Value(grantsKey{}).(grantSet)
	if !ok {
		return r, rel, nil
	}
	defer r.Close()
	resolved, err := resolveIn(r, rel)
	if err != nil {
		if errors.Is(err, errLeaves) {
			return nil, "", denied("%s %v", strconv.Quote(rel), err)
		}
		return nil, "", openError(rel, err)
	}
	for _, gp := range g.paths {
		grel, err := token.RootRelative(gp)
		if err != nil {
			continue
		}
		// A granted directory may itself be reached through a link: the
		// grant is where it leads, as for the sandbox's binds.
		gres, err := resolveIn(r, grel)
		if err != nil {
			continue
		}
		inner, ok := within(resolved, gres)
		if !ok {
			continue
		}
		// A granted directory that does not exist yet (write_file with
		// create_dirs makes it) is opened at its nearest existing parent;
		// only someone who can write there could race a link into it.
		base := gres
		for base != "." {
			if fi, err := r.Lstat(base); err == nil && fi.IsDir() {
				break
			}
			base = path.Dir(base)
			inner = ""
		}
		if inner == "" {
			inner, _ = within(resolved, base)
		}
		sub, err := r.OpenRoot(base)
		if err != nil {
			return nil, "", openError(rel, err)
		}
		return sub, inner, nil
	}
	shown := strconv.Quote(rel)
	if resolved != rel {
		shown += " (resolved to " + strconv.Quote(resolved) + ")"
	}
	return nil, "", api.NewError(api.PermissionDenied, api.EFilesystemDenied,
		"path %s is not granted by the token", shown).WithDetail("resolved_path", resolved)
}

// within reports whether p lies in dir (both root-relative, "." the root),
// comparing whole components, and returns p relative to dir.
func within(p, dir string) (string, bool) {
	switch {
	case dir == ".":
		return p, true
	case p == dir:
		return ".", true
	case strings.HasPrefix(p, dir+"/"):
		return p[len(dir)+1:], true
	}
	return "", false
}

// resolveIn resolves rel under r the way the kernel would, following every
// symlink, and returns the root-relative path with no link left in it ("."
// for the root). Components that do not exist are kept as written (a file
// about to be created). A link that is absolute, or climbs above the root,
// is errLeaves.
func resolveIn(r *os.Root, rel string) (string, error) {
	var done []string
	todo := strings.Split(rel, "/")
	links := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(done) == 0 {
				return "", errLeaves
			}
			done = done[:len(done)-1]
			continue
		}
		cur := path.Join(append(done, c)...)
		fi, err := r.Lstat(cur)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			done = append(done, c)
			continue
		case err != nil:
			return "", err
		case fi.Mode()&fs.ModeSymlink == 0:
			done = append(done, c)
			continue
		}
		if links++; links > maxLinks {
			return "", fmt.Errorf("%s: too many levels of symbolic links", cur)
		}
		target, err := r.Readlink(cur)
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			return "", errLeaves
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	if len(done) == 0 {
		return ".", nil
	}
	return path.Join(done...), nil
}
