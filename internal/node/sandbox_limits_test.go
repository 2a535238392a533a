package node_test

import (
	"errors"
	"fmt"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/topology"
	"golang.org/x/sys/unix"
	"os"
	"path/filepath"
	"testing"
)

// TestCLITmpfsBounded: /tmp and /work are memory, so each has a size (the
// manifest's tmp_mb, by default its memory limit): a tool writing past it
// fails with E3102 limit tmp_mb, and one writing within it succeeds.
func TestCLITmpfsBounded(t *testing.T) {
	e, n, _ := sandboxEnv(t, topology.TopologyOptions{})
	cases := []struct {
		name, script, limits, want string
	}{
		{"/tmp past memory_mb", `head -c 200000000 /dev/zero > /tmp/big && echo '{}'`,
			`{"timeout_ms":20000,"memory_mb":64,"file_size_mb":1024}`, api.EResourceLimit},
		{"/work past tmp_mb", `head -c 30000000 /dev/zero > a && head -c 30000000 /dev/zero > b && echo '{}'`,
			`{"timeout_ms":20000,"tmp_mb":40}`, api.EResourceLimit},
		{"/tmp within tmp_mb", `head -c 30000000 /dev/zero > /tmp/a && echo '{}'`,
			`{"timeout_ms":20000,"memory_mb":64,"tmp_mb":40}`, ""},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.t = t
			id := fmt.Sprintf("tmpfs.t%d", i)
			registerTools(t, n, cliTool(id, c.script, c.limits, ""))
			resp := e.invoke(request("tmpfs", id, `{"arg":""}`))
			if c.want == "" {
				if resp.Status != api.StatusSuccess {
					t.Fatalf("%s %s", resp.Status, mustJSON(t, resp.Error))
				}
				return
			}
			if resp.Status != api.StatusError || resp.Error == nil || resp.Error.ECode != c.want || resp.Error.Details["limit"] != "tmp_mb" {
				t.Fatalf("got %s %s, want %s limit tmp_mb", resp.Status, mustJSON(t, resp.Error), c.want)
			}
		})
	}
}

// TestCLIWritesRootOwnedGrant: when toolgate runs as root over a root-owned
// file root, a read-write grant is writable by the run's own uid for the
// run's duration (a POSIX ACL entry), without world-writable directories:
// the tool creates a file and appends to an existing one, and afterwards
// the directory and file carry no ACL and their modes are as before.
func TestCLIWritesRootOwnedGrant(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runs get their own uid only when toolgate runs as root")
	}
	e, n, root := sandboxEnv(t, topology.TopologyOptions{})
	dir := filepath.Join(root, "reports")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	existing := filepath.Join(dir, "sub", "log.txt")
	if err := os.WriteFile(existing, []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	registerTools(t, n, cliTool("test.rw_root_owned",
		`echo new > /files/reports/new.txt && echo two >> /files/reports/sub/log.txt && echo '{"ok":true}'`,
		"", `{"filesystem":[{"path":"/reports","mode":"rw"}]}`))
	resp := e.invoke(request("rwacl", "test.rw_root_owned", `{"arg":""}`))
	if resp.Status != api.StatusSuccess {
		t.Fatalf("%s %s", resp.Status, mustJSON(t, resp.Error))
	}
	if b, err := os.ReadFile(filepath.Join(dir, "new.txt")); err != nil || string(b) != "new\n" {
		t.Fatalf("new.txt: %q %v", b, err)
	}
	if b, err := os.ReadFile(existing); err != nil || string(b) != "one\ntwo\n" {
		t.Fatalf("log.txt: %q %v", b, err)
	}
	for p, mode := range map[string]os.FileMode{dir: 0o755, filepath.Join(dir, "sub"): 0o755, existing: 0o644} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != mode {
			t.Fatalf("%s: mode %v (want %v), %v", p, fi.Mode().Perm(), mode, err)
		}
		if _, err := unix.Getxattr(p, "system.posix_acl_access", make([]byte, 256)); !errors.Is(err, unix.ENODATA) {
			t.Fatalf("%s still has an ACL after the run: %v", p, err)
		}
	}
}
