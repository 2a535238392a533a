package sandbox

import (
	"context"
	"errors"
	"github.com/toolgate/toolgate/api"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func requireSandbox(t *testing.T) Config {
	t.Helper()
	if err := Available(); err != nil {
		t.Fatalf("these tests need bubblewrap and prlimit (.ci/run installs them): %v", err)
	}
	return Config{Mode: ModeBwrap}
}

func wantECode(t *testing.T, err error, codes ...string) {
	t.Helper()
	var te *api.Error
	if !errors.As(err, &te) {
		t.Fatalf("got %v, want one of %v", err, codes)
	}
	for _, c := range codes {
		if te.ECode == c {
			return
		}
	}
	t.Fatalf("got %s (%s), want one of %v", te.ECode, te.Message, codes)
}

// leftovers lists processes whose command line contains marker.
func leftovers(marker string) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err == nil && strings.Contains(string(b), marker) {
			out = append(out, f+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

func noLeftovers(t *testing.T, marker string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := leftovers(marker)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left behind: %v", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRunsAJSONTool(t *testing.T) {
	cfg := requireSandbox(t)
	argv, err := Expand([]string{"sh", "-c", `read -r line; printf '{"got":%s,"arg":"%s"}' "$line" "$1"`, "sh", "{{q}}"},
		[]byte(`{"q":"; rm -rf / $(id) `+"`id`"+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), cfg, Spec{Argv: argv, Stdin: []byte(`{"n":1}` + "\n"), Limits: Limits{Wall: 5 * time.Second}})
	if err != nil {
		t.Fatalf("%v: %s", err, res.Stderr)
	}
	// The parameter reached the tool as one inert argument.
	if string(res.Stdout) != `{"got":{"n":1},"arg":"; rm -rf / $(id) `+"`id`"+`"}` {
		t.Fatalf("stdout %s", res.Stdout)
	}
}

// TestRunAccounting: a run reports the CPU time and peak memory of its
// processes, from the kernel's accounting of the processes it waited for.
func TestRunAccounting(t *testing.T) {
	cfg := requireSandbox(t)
	// A loop for CPU, then dd with a 48 MiB buffer, which it fills.
	script := `i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; dd if=/dev/zero of=/dev/null bs=48M count=1 2>/dev/null; echo '{}'`
	res, err := Run(context.Background(), cfg, Spec{Argv: []string{"sh", "-c", script},
		Limits: Limits{Wall: 30 * time.Second, MemoryMB: 256}})
	if err != nil {
		t.Fatalf("%v: %s", err, res.Stderr)
	}
	if res.CPU < 20*time.Millisecond {
		t.Fatalf("CPU %v for a loop of 100,000 steps", res.CPU)
	}
	if res.MaxRSSKB < 48*1024 || res.MaxRSSKB > 256*1024 {
		t.Fatalf("peak memory %d KiB for a 48 MiB buffer", res.MaxRSSKB)
	}
	if res.NetIn != 0 || res.NetOut != 0 {
		t.Fatalf("network bytes %d/%d without network", res.NetIn, res.NetOut)
	}
}

// TestContainsAttacks: each hostile tool is stopped with its code, leaves no
// process behind, and touches nothing of the host.
func TestContainsAttacks(t *testing.T) {
	cfg := requireSandbox(t)
	cases := []struct {
		name   string
		argv   []string
		limits Limits
		codes  []string
		marker string
	}{
		{"fork bomb", []string{"sh", "-c", `b() { b | b & }; b; sleep 30 # forkbomb-marker`}, Limits{Wall: 3 * time.Second, PIDs: 32},
			[]string{api.ETimeout, api.EResourceLimit, api.EToolFailed, api.ESandboxCrashed}, "forkbomb-marker"},
		{"memory hog", []string{"sh", "-c", `head -c 400000000 /dev/zero | tail -c 300000000 >/dev/null # memhog-marker`}, Limits{Wall: 10 * time.Second, MemoryMB: 64},
			[]string{api.EResourceLimit}, "memhog-marker"},
		{"busy loop past its CPU time", []string{"sh", "-c", `while :; do :; done # cpu-marker`}, Limits{Wall: 10 * time.Second, CPUSeconds: 1},
			[]string{api.EResourceLimit}, "cpu-marker"},
		{"sleeper past its wall time", []string{"sh", "-c", `sleep 30 # sleeper-marker`}, Limits{Wall: time.Second},
			[]string{api.ETimeout}, "sleeper-marker"},
		{"stdout flood", []string{"sh", "-c", `head -c 104857600 /dev/zero # flood-marker`}, Limits{Wall: 10 * time.Second, OutputBytes: 1 << 20},
			[]string{api.EResourceLimit}, "flood-marker"},
		{"connects to the NATS port", []string{"bash", "-c", `exec 3<>/dev/tcp/127.0.0.1/4222 # net-marker`}, Limits{Wall: 5 * time.Second},
			[]string{api.EToolFailed}, "net-marker"},
		{"reads /etc/shadow", []string{"cat", "/etc/shadow"}, Limits{Wall: 5 * time.Second},
			[]string{api.EToolFailed}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			res, err := Run(context.Background(), cfg, Spec{Argv: c.argv, Limits: c.limits})
			wantECode(t, err, c.codes...)
			if len(res.Stdout) > 1<<20 {
				t.Fatalf("kept %d bytes of stdout", len(res.Stdout))
			}
			if c.marker != "" {
				noLeftovers(t, c.marker)
			}
			t.Logf("%s stopped after %v: %v", c.name, time.Since(start).Round(time.Millisecond), err)
		})
	}
}

// TestFilesystemConfinement: only granted paths are visible, writes stay in
// read-write grants, and neither .. nor a symlink leads out.
func TestFilesystemConfinement(t *testing.T) {
	cfg := requireSandbox(t)
	root := t.TempDir()
	outside := t.TempDir()
	// The tool runs as nobody when the test runs as root: the file root must
	// be reachable by it, as in a deployment.
	for _, d := range []string{filepath.Dir(root), root, outside} {
		_ = os.Chmod(d, 0o755)
	}
	if err := os.MkdirAll(filepath.Join(root, "data"), 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(filepath.Join(root, "data"), 0o777)
	secret := filepath.Join(outside, "secret.txt")
	if err := os.WriteFile(secret, []byte("secret"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "data", "link")); err != nil {
		t.Fatal(err)
	}
	mounts, err := Mounts(root, []string{"/data"}, true)
	if err != nil || len(mounts) != 1 || mounts[0].Path != "/files/data" {
		t.Fatalf("mounts %+v, %v", mounts, err)
	}
	run := func(script string) (Result, error) {
		return Run(context.Background(), cfg, Spec{Argv: []string{"sh", "-c", script}, Mounts: mounts, Limits: Limits{Wall: 5 * time.Second}})
	}
	if res, err := run(`echo ok > /files/data/out.txt && cat /files/data/out.txt`); err != nil || strings.TrimSpace(string(res.Stdout)) != "ok" {
		t.Fatalf("write in the grant: %s %v %s", res.Stdout, err, res.Stderr)
	}
	if _, err := os.Stat(filepath.Join(root, "data", "out.txt")); err != nil {
		t.Fatalf("the granted write did not reach the host: %v", err)
	}
	_, _ = run(`echo x > /files/data/../escape.txt; echo x > /files/data/link/secret.txt; cat /files/data/link/secret.txt`)
	if _, err := os.Stat(filepath.Join(root, "escape.txt")); err == nil {
		t.Fatal("a write by .. reached the host outside the grant")
	}
	if b, _ := os.ReadFile(secret); string(b) != "secret" {
		t.Fatalf("a write through a symlink changed a file outside the grant: %q", b)
	}
	if res, err := run(`cat ` + secret); err == nil {
		t.Fatalf("a host path outside the grants was readable: %s", res.Stdout)
	}
	// A granted path that is itself a link out of the root is refused.
	if _, err := Mounts(root, []string{"/data/link"}, false); err == nil {
		t.Fatal("a grant leading out of the root through a link was accepted")
	}
}

func TestCancelKillsTheTree(t *testing.T) {
	cfg := requireSandbox(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	_, err := Run(ctx, cfg, Spec{Argv: []string{"sh", "-c", `sleep 30 & sleep 30 # cancel-marker`}, Limits: Limits{Wall: 20 * time.Second}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	noLeftovers(t, "cancel-marker")
}

// TestRunsBackToBack: a run leaves no process behind, not even a zombie
// waiting for the host's init to reap it, so a worker's runs in quick
// succession never use up the tool user's process limit.
func TestRunsBackToBack(t *testing.T) {
	cfg := requireSandbox(t)
	for i := range 150 {
		res, err := Run(context.Background(), cfg, Spec{Argv: []string{"sh", "-c", "echo '{}'"}, Limits: Limits{Wall: 5 * time.Second, PIDs: 8}})
		if err != nil || strings.TrimSpace(string(res.Stdout)) != "{}" {
			t.Fatalf("run %d: %v: %s", i, err, res.Stderr)
		}
	}
}

// TestRunsHaveTheirOwnProcessBudget: a run holding many processes does not
// use up the process limit of a concurrent run, since each runs under a uid
// of its own (RLIMIT_NPROC counts per uid).
func TestRunsHaveTheirOwnProcessBudget(t *testing.T) {
	cfg := requireSandbox(t)
	if os.Geteuid() != 0 {
		t.Skip("process limits and run uids apply when toolgate runs as root")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	busy := make(chan error, 1)
	go func() {
		_, err := Run(ctx, cfg, Spec{Argv: []string{"sh", "-c", `for i in $(seq 24); do sleep 31 & done; wait # budget-marker`},
			Limits: Limits{Wall: 30 * time.Second, PIDs: 64}})
		busy <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	const sleeper = "sleep\x0031" // argv as /proc shows it
	for len(leftovers(sleeper)) < 24 {
		if time.Now().After(deadline) {
			t.Fatalf("the busy run started %d processes", len(leftovers(sleeper)))
		}
		time.Sleep(20 * time.Millisecond)
	}
	res, err := Run(context.Background(), cfg, Spec{Argv: []string{"sh", "-c", `true | true | cat; echo '{}'`}, Limits: Limits{Wall: 5 * time.Second, PIDs: 8}})
	if err != nil {
		t.Fatalf("a run beside a busy one could not start its processes: %v: %s", err, res.Stderr)
	}
	cancel()
	<-busy
	noLeftovers(t, "budget-marker")
}

// TestRelativeFileRoot: a file root given relative to the working directory
// (make run's --file-root) binds its grants; bwrap, which runs in the run's
// private directory, would not find a relative source.
func TestRelativeFileRoot(t *testing.T) {
	cfg := requireSandbox(t)
	root := t.TempDir()
	for _, d := range []string{filepath.Dir(root), root} {
		_ = os.Chmod(d, 0o755)
	}
	if err := os.WriteFile(filepath.Join(root, "hello.txt"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(filepath.Dir(root))
	mounts, err := Mounts(filepath.Base(root), []string{"/"}, false)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), cfg, Spec{Argv: []string{"cat", "/files/hello.txt"}, Mounts: mounts,
		Limits: Limits{Wall: 5 * time.Second}})
	if err != nil || string(res.Stdout) != "hello" {
		t.Fatalf("read through a relative root: %q %v %s", res.Stdout, err, res.Stderr)
	}
}

// TestUnreachableGrant: a grant under a directory the run's own uid cannot
// enter (a 0700 home directory) is refused before bwrap starts, with the
// path, the blocking directory and the uid.
func TestUnreachableGrant(t *testing.T) {
	cfg := requireSandbox(t)
	if os.Geteuid() != 0 {
		t.Skip("runs get a uid of their own only when toolgate runs as root")
	}
	home := t.TempDir()
	_ = os.Chmod(filepath.Dir(home), 0o755)
	if err := os.Chmod(home, 0o700); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(home, "files")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	mounts, err := Mounts(root, []string{"/"}, false)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), cfg, Spec{Argv: []string{"true"}, Mounts: mounts, Limits: Limits{Wall: 5 * time.Second}})
	wantECode(t, err, api.EExecutorUnavailable)
	var te *api.Error
	errors.As(err, &te)
	uid, _ := te.Details["uid"].(uint32)
	if te.Details["path"] != root || te.Details["blocked_at"] != home || uid < UIDBase ||
		!strings.Contains(te.Message, root) || !strings.Contains(te.Message, "uid") {
		t.Fatalf("error does not name the path, the directory and the uid: %s %v", te.Message, te.Details)
	}
}
