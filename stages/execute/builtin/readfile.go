package builtin

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"github.com/toolgate/toolgate/api"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"unicode/utf8"
)

const (
	defaultMaxBytes = 64 << 10
	maxMaxBytes     = 1 << 20
)

// readFile reads a regular file under root. Confinement is os.Root's: it
// resolves every component, symlinks included, inside the root and refuses
// anything that would leave it, so "..", absolute paths and links pointing out
// are all denied.
func readFile(root string) Func {
	return func(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
		var p struct {
			Path     string `json:"path"`
			MaxBytes int64  `json:"max_bytes"`
		}
		if err := decode(params, &p); err != nil {
			return nil, err
		}
		if p.MaxBytes == 0 {
			p.MaxBytes = defaultMaxBytes
		}
		if p.MaxBytes < 1 || p.MaxBytes > maxMaxBytes {
			return nil, invalid("max_bytes must be between 1 and %d", maxMaxBytes)
		}
		rel, err := rootPath(p.Path)
		if err != nil {
			return nil, err
		}
		r, at, err := confine(ctx, root, "read_file", rel)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		// O_NONBLOCK: opening a FIFO must not wait for a writer.
		f, err := r.OpenFile(at, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return nil, openError(p.Path, err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return nil, failed(err, "stat %s: %v", p.Path, err)
		}
		if !fi.Mode().IsRegular() {
			return nil, denied("%s is not a regular file", p.Path)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		data, err := io.ReadAll(io.LimitReader(f, p.MaxBytes+1))
		if err != nil {
			return nil, api.WrapError(err, api.ToolExecutionError, api.EToolFailed, "reading %s: %v", p.Path, err)
		}
		truncated := int64(len(data)) > p.MaxBytes
		if truncated {
			data = data[:p.MaxBytes]
		}
		out := map[string]any{"path": rel, "size": fi.Size(), "truncated": truncated}
		if utf8.Valid(data) {
			out["content"] = string(data)
		} else {
			out["content"] = base64.StdEncoding.EncodeToString(data)
			out["encoding"] = "base64"
		}
		return json.Marshal(out)
	}
}

func openError(p string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return api.WrapError(err, api.ToolExecutionError, api.EToolFailed, "%s: no such file", p)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "escapes") {
		return api.WrapError(err, api.PermissionDenied, api.EPathOutsideRoots, "%s is outside the granted directory", p)
	}
	return api.WrapError(err, api.PermissionDenied, api.EPathOutsideRoots, "%s: %v", p, err)
}
