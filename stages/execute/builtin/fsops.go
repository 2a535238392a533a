package builtin

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/token"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Limits of the file builtins.
const (
	maxWriteBytes      = 1 << 20  // content of one write_file or append_file call
	maxAppendFileBytes = 16 << 20 // append_file refuses to grow a file past this
	defaultMaxEntries  = 1000
	maxMaxEntries      = 10000
	defaultFileMode    = 0o644
)

// denied is the refusal for anything that would leave the file root or touch
// something other than a regular file or directory.
func denied(format string, args ...any) error {
	return api.NewError(api.PermissionDenied, api.EPathOutsideRoots, format, args...)
}

func failed(err error, format string, args ...any) error {
	return api.WrapError(err, api.ToolExecutionError, api.EToolFailed, format, args...)
}

func tooLarge(format string, args ...any) error {
	return api.NewError(api.InvalidParameters, api.EParameterBounds, format, args...)
}

// rootPath checks a path parameter and returns it relative to the file root,
// normalised by token.RootRelative like the grants authorize compared it
// with: a leading slash means the root, and parent segments are refused
// outright. os.Root does the confining: it refuses symlinks that lead out.
func rootPath(p string) (string, error) {
	if p == "" || strings.ContainsRune(p, 0) {
		return "", invalid("path must be a non-empty string without NUL bytes")
	}
	rel, err := token.RootRelative(p)
	if err != nil {
		return "", denied("%s climbs out through a parent segment", strconv.Quote(p))
	}
	return rel, nil
}

// openRoot opens the configured file root, refusing when there is none.
func openRoot(root, tool string) (*os.Root, error) {
	if root == "" {
		return nil, denied("%s has no file root configured", tool)
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, failed(err, "opening file root: %v", err)
	}
	return r, nil
}

// content decodes the content parameter of the write builtins.
func content(s, encoding string) ([]byte, error) {
	var data []byte
	switch encoding {
	case "", "utf8":
		data = []byte(s)
	case "base64":
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, invalid("content is not valid base64: %v", err)
		}
		data = b
	default:
		return nil, invalid("encoding must be utf8 or base64")
	}
	if len(data) > maxWriteBytes {
		return nil, tooLarge("content is %d bytes, the limit is %d", len(data), maxWriteBytes)
	}
	return data, nil
}

// fileMode reads an octal permission string such as "0640". Only permission
// bits are accepted: setuid, setgid and sticky are not the business of a tool.
func fileMode(s string) (os.FileMode, bool, error) {
	if s == "" {
		return defaultFileMode, false, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o777 {
		return 0, false, invalid("mode %q must be octal permission bits between 0 and 0777", s)
	}
	return os.FileMode(m), true, nil
}

// writeFile creates or replaces a regular file under root. The content goes
// to a temporary file in the same directory which is then renamed over the
// target, so readers see the old file or the new one, never a torn one, and a
// rename never follows a symlink or writes into a FIFO or device: targets that
// are not regular files are refused before anything is written.
func writeFile(root string) Func {
	return func(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
		var p struct {
			Path       string `json:"path"`
			Content    string `json:"content"`
			Encoding   string `json:"encoding"`
			Mode       string `json:"mode"`
			Overwrite  *bool  `json:"overwrite"`
			CreateDirs bool   `json:"create_dirs"`
		}
		if err := decode(params, &p); err != nil {
			return nil, err
		}
		rel, err := rootPath(p.Path)
		if err != nil {
			return nil, err
		}
		if rel == "." {
			return nil, invalid("path names the file root, not a file")
		}
		data, err := content(p.Content, p.Encoding)
		if err != nil {
			return nil, err
		}
		mode, modeSet, err := fileMode(p.Mode)
		if err != nil {
			return nil, err
		}
		overwrite := p.Overwrite == nil || *p.Overwrite
		r, at, err := confine(ctx, root, "write_file", rel)
		if err != nil {
			return nil, err
		}
		defer r.Close()

		dir := path.Dir(at)
		if p.CreateDirs && dir != "." {
			if err := r.MkdirAll(dir, 0o755); err != nil {
				return nil, openError(p.Path, err)
			}
		}
		created := true
		switch fi, err := r.Lstat(at); {
		case err == nil:
			if !fi.Mode().IsRegular() {
				return nil, denied("%s exists and is not a regular file (%s)", p.Path, fileType(fi.Mode()))
			}
			if !overwrite {
				return nil, failed(fs.ErrExist, "%s exists and overwrite is false", p.Path)
			}
			created = false
			if !modeSet {
				mode = fi.Mode().Perm() // replacing a file keeps its permissions
			}
		case !errors.Is(err, fs.ErrNotExist):
			return nil, openError(p.Path, err)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}

		tmp, err := tempName(dir, path.Base(at))
		if err != nil {
			return nil, failed(err, "naming a temporary file: %v", err)
		}
		f, err := r.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, openError(p.Path, err)
		}
		committed := false
		defer func() {
			if !committed {
				f.Close()
				_ = r.Remove(tmp)
			}
		}()
		if _, err := f.Write(data); err != nil {
			return nil, failed(err, "writing %s: %v", p.Path, err)
		}
		// Chmod after creation so the result does not depend on the umask.
		if err := f.Chmod(mode); err != nil {
			return nil, failed(err, "setting the mode of %s: %v", p.Path, err)
		}
		if err := f.Sync(); err != nil {
			return nil, failed(err, "syncing %s: %v", p.Path, err)
		}
		if err := f.Close(); err != nil {
			return nil, failed(err, "closing %s: %v", p.Path, err)
		}
		if err := ctx.Err(); err != nil {
			_ = r.Remove(tmp)
			committed = true
			return nil, err
		}
		if overwrite {
			err = r.Rename(tmp, at)
		} else {
			// A hard link fails when the target appeared meanwhile, which
			// a rename would silently replace.
			if err = r.Link(tmp, at); err == nil {
				_ = r.Remove(tmp)
			}
		}
		if err != nil {
			_ = r.Remove(tmp)
			committed = true
			if errors.Is(err, fs.ErrExist) {
				return nil, failed(err, "%s exists and overwrite is false", p.Path)
			}
			return nil, openError(p.Path, err)
		}
		committed = true
		return json.Marshal(map[string]any{"path": rel, "bytes_written": len(data), "created": created,
			"mode": "0" + strconv.FormatUint(uint64(mode), 8)})
	}
}

// tempName is a fresh name beside the target, hidden and unlikely to collide.
func tempName(dir, base string) (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	name := "." + base + ".tmp-" + hex.EncodeToString(b[:])
	if len(name) > 255 {
		name = ".toolgate.tmp-" + hex.EncodeToString(b[:])
	}
	return path.Join(dir, name), nil
}

// appendFile adds content to the end of a regular file under root, creating
// it when asked. The file is opened first and checked after, on the open
// descriptor, so nothing is written to a FIFO or device even if the path
// changes in between; O_NONBLOCK keeps the open of a FIFO from waiting for a
// reader.
func appendFile(root string) Func {
	return func(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
		var p struct {
			Path     string `json:"path"`
			Content  string `json:"content"`
			Encoding string `json:"encoding"`
			Mode     string `json:"mode"`
			Create   *bool  `json:"create"`
		}
		if err := decode(params, &p); err != nil {
			return nil, err
		}
		rel, err := rootPath(p.Path)
		if err != nil {
			return nil, err
		}
		data, err := content(p.Content, p.Encoding)
		if err != nil {
			return nil, err
		}
		mode, _, err := fileMode(p.Mode)
		if err != nil {
			return nil, err
		}
		r, at, err := confine(ctx, root, "append_file", rel)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		flags := os.O_WRONLY | os.O_APPEND | syscall.O_NONBLOCK
		if p.Create == nil || *p.Create {
			flags |= os.O_CREATE
		}
		f, err := r.OpenFile(at, flags, mode)
		if err != nil {
			if errors.Is(err, syscall.ENXIO) {
				return nil, denied("%s is not a regular file", p.Path)
			}
			return nil, openError(p.Path, err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return nil, failed(err, "stat %s: %v", p.Path, err)
		}
		if !fi.Mode().IsRegular() {
			return nil, denied("%s is not a regular file (%s)", p.Path, fileType(fi.Mode()))
		}
		if fi.Size()+int64(len(data)) > maxAppendFileBytes {
			return nil, tooLarge("appending %d bytes would take %s past %d bytes", len(data), p.Path, maxAppendFileBytes)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if _, err := f.Write(data); err != nil {
			return nil, failed(err, "appending to %s: %v", p.Path, err)
		}
		if err := f.Close(); err != nil {
			return nil, failed(err, "closing %s: %v", p.Path, err)
		}
		return json.Marshal(map[string]any{"path": rel, "bytes_appended": len(data), "size": fi.Size() + int64(len(data))})
	}
}

// listDir lists a directory under root: name, type and size of each entry,
// sorted by name. Entries are reported as they are (a symlink is a symlink,
// not followed), and at most max_entries of them are read.
func listDir(root string) Func {
	return func(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
		var p struct {
			Path       string `json:"path"`
			MaxEntries int    `json:"max_entries"`
		}
		if err := decode(params, &p); err != nil {
			return nil, err
		}
		if p.Path == "" {
			p.Path = "."
		}
		if p.MaxEntries == 0 {
			p.MaxEntries = defaultMaxEntries
		}
		if p.MaxEntries < 1 || p.MaxEntries > maxMaxEntries {
			return nil, invalid("max_entries must be between 1 and %d", maxMaxEntries)
		}
		rel, err := rootPath(p.Path)
		if err != nil {
			return nil, err
		}
		r, at, err := confine(ctx, root, "list_dir", rel)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		// O_DIRECTORY: anything else, a FIFO above all, fails the open.
		d, err := r.OpenFile(at, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NONBLOCK, 0)
		if err != nil {
			if errors.Is(err, syscall.ENOTDIR) {
				return nil, invalid("%s is not a directory", p.Path)
			}
			return nil, openError(p.Path, err)
		}
		defer d.Close()
		ents, err := d.ReadDir(p.MaxEntries + 1)
		if err != nil && len(ents) == 0 && !errors.Is(err, io.EOF) {
			return nil, failed(err, "listing %s: %v", p.Path, err)
		}
		truncated := len(ents) > p.MaxEntries
		if truncated {
			ents = ents[:p.MaxEntries]
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		type entry struct {
			Name string `json:"name"`
			Type string `json:"type"`
			Size int64  `json:"size"`
		}
		out := make([]entry, 0, len(ents))
		for _, e := range ents {
			en := entry{Name: e.Name(), Type: fileType(e.Type())}
			if e.Type().IsRegular() {
				if fi, err := e.Info(); err == nil {
					en.Size = fi.Size()
				}
			}
			out = append(out, en)
		}
		slices.SortFunc(out, func(a, b entry) int { return strings.Compare(a.Name, b.Name) })
		return json.Marshal(map[string]any{"path": rel, "entries": out, "truncated": truncated})
	}
}

// statFile describes one path under root. It follows symlinks that stay in
// the root (and says the path is one) and refuses those that leave it.
func statFile(root string) Func {
	return func(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
		var p struct {
			Path string `json:"path"`
		}
		if err := decode(params, &p); err != nil {
			return nil, err
		}
		rel, err := rootPath(p.Path)
		if err != nil {
			return nil, err
		}
		r, at, err := confine(ctx, root, "stat", rel)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		fi, err := r.Stat(at)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return json.Marshal(map[string]any{"path": rel, "exists": false})
			}
			return nil, openError(p.Path, err)
		}
		link := false
		if li, err := r.Lstat(at); err == nil {
			link = li.Mode()&fs.ModeSymlink != 0
		}
		size := int64(0)
		if fi.Mode().IsRegular() {
			size = fi.Size()
		}
		return json.Marshal(map[string]any{"path": rel, "exists": true, "type": fileType(fi.Mode()), "size": size,
			"mode": "0" + strconv.FormatUint(uint64(fi.Mode().Perm()), 8), "symlink": link,
			"modified_at": fi.ModTime().UTC().Format(time.RFC3339Nano)})
	}
}

// fileType names a file mode's type the way the manifests' schemas list them.
func fileType(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "file"
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m&fs.ModeNamedPipe != 0:
		return "fifo"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device"
	default:
		return "other"
	}
}
