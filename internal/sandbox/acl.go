package sandbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// When toolgate runs as root, a run's own uid owns nothing, so a read-write
// grant over a root-owned file root would be unusable without making
// directories world-writable. Instead each read-write grant gives the run's
// uid a POSIX ACL entry (user:UID:rwx on directories, rw on files) on the
// granted directory and what it holds, for the run's duration, and takes it
// away afterwards. Entries are set through descriptors opened inside an
// os.Root at the granted directory, so a symlink swapped in by another run
// cannot make toolgate change an ACL outside it.

// maxACLEntries bounds the files and directories of one grant given an
// entry; past it, only those reached first (the granted directory itself
// before anything in it) are writable.
const maxACLEntries = 10000

const (
	xattrACL    = "system.posix_acl_access"
	aclVersion  = 2
	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclGroup    = 0x08
	aclMask     = 0x10
	aclOther    = 0x20
	aclNoID     = 0xffffffff
)

type aclEntry struct {
	tag, perm uint16
	id        uint32
}

// aclMu serialises this process's read-modify-writes of ACLs.
var aclMu sync.Mutex

// grantWrite gives uid write access to dir and what it holds; the returned
// function takes it away. Failures are start errors: a run whose grant
// cannot be made writable does not start.
func grantWrite(dir string, uid uint32) (func(), error) {
	aclMu.Lock()
	defer aclMu.Unlock()
	var done []string
	remove := func() {
		eachEntry(dir, done, func(f *os.File, fi fs.FileInfo) error { return removeUser(f, fi, uid) })
	}
	err := walkEntries(dir, func(rel string, f *os.File, fi fs.FileInfo) error {
		perm := uint16(6)
		if fi.IsDir() || fi.Mode()&0o100 != 0 {
			perm = 7
		}
		if err := addUser(f, fi, uid, perm); err != nil {
			return err
		}
		done = append(done, rel)
		return nil
	})
	if err != nil {
		remove()
		return nil, fmt.Errorf("giving the run's uid %d write access to %s: %w", uid, dir, err)
	}
	return func() {
		aclMu.Lock()
		defer aclMu.Unlock()
		remove()
	}, nil
}

// walkEntries calls fn with each directory and regular file under dir (dir
// first), opened inside an os.Root at dir, up to maxACLEntries.
func walkEntries(dir string, fn func(rel string, f *os.File, fi fs.FileInfo) error) error {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer r.Close()
	n := 0
	return fs.WalkDir(r.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return nil
		}
		if n++; n > maxACLEntries {
			return fs.SkipAll
		}
		return withEntry(r, p, func(f *os.File, fi fs.FileInfo) error { return fn(p, f, fi) })
	})
}

// eachEntry calls fn with each of rels under dir, ignoring failures: the
// tool may have removed or replaced them.
func eachEntry(dir string, rels []string, fn func(*os.File, fs.FileInfo) error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return
	}
	defer r.Close()
	for _, p := range rels {
		_ = withEntry(r, p, fn)
	}
}

func withEntry(r *os.Root, p string, fn func(*os.File, fs.FileInfo) error) error {
	f, err := r.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.IsDir() && !fi.Mode().IsRegular() {
		return nil // replaced meanwhile
	}
	return fn(f, fi)
}

// addUser sets the entry user:uid:perm in f's access ACL, widening the mask
// to let it through.
func addUser(f *os.File, fi fs.FileInfo, uid uint32, perm uint16) error {
	es, err := readACL(f, fi)
	if err != nil {
		return err
	}
	es = slices.DeleteFunc(es, func(e aclEntry) bool { return e.tag == aclUser && e.id == uid })
	es = append(es, aclEntry{tag: aclUser, perm: perm, id: uid})
	i := slices.IndexFunc(es, func(e aclEntry) bool { return e.tag == aclMask })
	if i < 0 {
		mask := uint16(0)
		for _, e := range es {
			if e.tag == aclGroupObj || e.tag == aclUser || e.tag == aclGroup {
				mask |= e.perm
			}
		}
		es = append(es, aclEntry{tag: aclMask, perm: mask, id: aclNoID})
	} else {
		es[i].perm |= perm
	}
	return writeACL(f, es)
}

// removeUser takes uid's entry out of f's ACL. When no named entry is left,
// the ACL goes and the mode's group bits are the owning group's again (an
// ACL's mask stands in them while it exists).
func removeUser(f *os.File, fi fs.FileInfo, uid uint32) error {
	es, err := readACL(f, fi)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(es, func(e aclEntry) bool { return e.tag == aclUser && e.id == uid }) {
		return nil
	}
	es = slices.DeleteFunc(es, func(e aclEntry) bool { return e.tag == aclUser && e.id == uid })
	if slices.ContainsFunc(es, func(e aclEntry) bool { return e.tag == aclUser || e.tag == aclGroup }) {
		return writeACL(f, es)
	}
	var group uint16
	for _, e := range es {
		if e.tag == aclGroupObj {
			group = e.perm
		}
	}
	if err := unix.Fremovexattr(int(f.Fd()), xattrACL); err != nil && !errors.Is(err, unix.ENODATA) {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		return err
	}
	mode := st.Mode()
	perm := mode.Perm()&^0o070 | fs.FileMode(group)<<3
	return f.Chmod(mode&^fs.ModePerm | perm)
}

// readACL returns f's access ACL, or the one its mode bits amount to.
func readACL(f *os.File, fi fs.FileInfo) ([]aclEntry, error) {
	buf := make([]byte, 1024)
	n, err := unix.Fgetxattr(int(f.Fd()), xattrACL, buf)
	if errors.Is(err, unix.ENODATA) {
		m := uint16(fi.Mode().Perm())
		return []aclEntry{{aclUserObj, m >> 6 & 7, aclNoID}, {aclGroupObj, m >> 3 & 7, aclNoID}, {aclOther, m & 7, aclNoID}}, nil
	}
	if err != nil {
		return nil, err
	}
	b := buf[:n]
	if len(b) < 4 || binary.LittleEndian.Uint32(b) != aclVersion || (len(b)-4)%8 != 0 {
		return nil, fmt.Errorf("unreadable ACL on %s", f.Name())
	}
	var es []aclEntry
	for b = b[4:]; len(b) > 0; b = b[8:] {
		es = append(es, aclEntry{binary.LittleEndian.Uint16(b), binary.LittleEndian.Uint16(b[2:]), binary.LittleEndian.Uint32(b[4:])})
	}
	return es, nil
}

func writeACL(f *os.File, es []aclEntry) error {
	slices.SortFunc(es, func(a, b aclEntry) int {
		if a.tag != b.tag {
			return int(a.tag) - int(b.tag)
		}
		return int(int64(a.id) - int64(b.id))
	})
	b := binary.LittleEndian.AppendUint32(nil, aclVersion)
	for _, e := range es {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	return unix.Fsetxattr(int(f.Fd()), xattrACL, b, 0)
}
