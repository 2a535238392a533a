package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestGrantWriteOverlapping: two runs granted the same directory each get
// and lose their own entry; when the last is gone so is the ACL, and the
// mode is what it was. A symlink in the directory is not followed.
func TestGrantWriteOverlapping(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("ACL entries for other uids need root")
	}
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(outside, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	undoA, err := grantWrite(dir, UIDBase+1)
	if err != nil {
		t.Fatal(err)
	}
	undoB, err := grantWrite(dir, UIDBase+2)
	if err != nil {
		t.Fatal(err)
	}
	users := func(p string) map[uint32]uint16 {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fi, _ := f.Stat()
		es, err := readACL(f, fi)
		if err != nil {
			t.Fatal(err)
		}
		out := map[uint32]uint16{}
		for _, e := range es {
			if e.tag == aclUser {
				out[e.id] = e.perm
			}
		}
		return out
	}
	if u := users(dir); u[UIDBase+1] != 7 || u[UIDBase+2] != 7 {
		t.Fatalf("entries %v", u)
	}
	undoA()
	if u := users(dir); len(u) != 1 || u[UIDBase+2] != 7 {
		t.Fatalf("after one run: %v", u)
	}
	undoB()
	if _, err := unix.Getxattr(dir, xattrACL, make([]byte, 256)); !errors.Is(err, unix.ENODATA) {
		t.Fatalf("ACL left: %v", err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o750 {
		t.Fatalf("mode %v", fi.Mode().Perm())
	}
	if _, err := unix.Getxattr(outside, xattrACL, make([]byte, 256)); !errors.Is(err, unix.ENODATA) {
		t.Fatalf("the link's target got an ACL: %v", err)
	}
}
