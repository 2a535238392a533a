package sandbox

import (
	"fmt"
	"github.com/toolgate/toolgate/api"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// reachable checks that uid, a run's own uid, can reach host: search
// permission on every directory above it, and read (and search, for a
// directory) on host itself. A run's uid owns nothing and is in no group
// but its own, so a 0700 parent such as a home directory hides a grant from
// it, and bwrap would only say "Permission denied" or "Can't find source
// path" without naming the directory or the uid.
func reachable(host string, uid uint32) error {
	if !filepath.IsAbs(host) {
		return startErr(fmt.Errorf("bind source %s is not absolute", host))
	}
	clean := filepath.Clean(host)
	dir := "/"
	parts := strings.Split(strings.TrimPrefix(clean, "/"), "/")
	if clean == "/" {
		parts = nil
	}
	for i := 0; i <= len(parts); i++ {
		last := i == len(parts)
		fi, err := os.Stat(dir)
		if err != nil {
			return startErr(err)
		}
		need := fs.FileMode(0o1) // search
		if last {
			need = 0o4 // read
			if fi.IsDir() {
				need |= 0o1
			}
		}
		if !allows(fi, uid, need) {
			return api.NewError(api.SandboxFailure, api.EExecutorUnavailable,
				"granted path %s is unreachable for the sandbox's uid %d: %s is mode %v and does not let other users %s it "+
					"(sandboxed runs use a uid of their own; see docs/sandbox.md)",
				host, uid, dir, fi.Mode().Perm(), verb(last)).
				WithDetail("not_started", true).WithDetail("path", host).WithDetail("blocked_at", dir).WithDetail("uid", uid)
		}
		if !last {
			dir = filepath.Join(dir, parts[i])
		}
	}
	return nil
}

func verb(last bool) string {
	if last {
		return "read"
	}
	return "enter"
}

// allows reports whether uid (whose only group is gid uid) has the
// permission bits need (given as the "other" triple) on fi.
func allows(fi fs.FileInfo, uid uint32, need fs.FileMode) bool {
	perm := fi.Mode().Perm()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		switch {
		case st.Uid == uid:
			return perm>>6&need == need
		case st.Gid == uid:
			return perm>>3&need == need
		}
	}
	return perm&need == need
}
