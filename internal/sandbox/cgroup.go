package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// CPUCgroup applies a run's CPU share (millicores) through a cgroup of its
// own under the one toolgate runs in: cpu.max on cgroup v2, cpu.cfs_quota_us
// on v1's cpu controller. DetectCPU finds one where the host lets toolgate
// make it; without one the share is not applied, and callers say so.
type CPUCgroup struct {
	// Dir holds the runs' cgroups; V2 says which interface it has.
	Dir string
	V2  bool
}

// cfsPeriod is the accounting period of a CPU quota: a share of m
// millicores is m*100 µs of CPU time in each 100 ms.
const cfsPeriod = 100_000

// DetectCPU finds where toolgate may make a cgroup per run with a CPU
// share, or says why it cannot: cgroup v2 needs toolgate's own cgroup
// delegated to it (writable, the cpu controller available and no process of
// its own left in it once toolgate moves into a leaf); v1 needs the cpu
// controller mounted and toolgate's cgroup in it writable.
func DetectCPU() (*CPUCgroup, error) {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil {
		return nil, fmt.Errorf("no cgroup file system at /sys/fs/cgroup: %w", err)
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("reading /proc/self/cgroup: %w", err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return detectV2(own)
	}
	return detectV1(own)
}

// cgroupPath is the path of toolgate's cgroup in the hierarchy whose
// controller list (the second field of /proc/self/cgroup) satisfies match.
func cgroupPath(own []byte, match func(controllers []string) bool) (string, bool) {
	sc := bufio.NewScanner(bytes.NewReader(own))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) == 3 && match(strings.Split(parts[1], ",")) {
			return parts[2], true
		}
	}
	return "", false
}

func detectV1(own []byte) (*CPUCgroup, error) {
	rel, ok := cgroupPath(own, func(c []string) bool {
		for _, x := range c {
			if x == "cpu" {
				return true
			}
		}
		return false
	})
	if !ok {
		return nil, errors.New("cgroup v1 without the cpu controller")
	}
	var mount string
	for _, m := range []string{"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"} {
		if _, err := os.Stat(filepath.Join(m, "cpu.cfs_quota_us")); err == nil {
			mount = m
			break
		}
	}
	if mount == "" {
		return nil, errors.New("cgroup v1: the cpu controller is not mounted at /sys/fs/cgroup/cpu")
	}
	dir := filepath.Join(mount, rel, "toolgate")
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("cgroup v1: toolgate's cgroup %s is not writable: %w", filepath.Dir(dir), err)
	}
	sweep(dir)
	return &CPUCgroup{Dir: dir}, nil
}

func detectV2(own []byte) (*CPUCgroup, error) {
	rel, ok := cgroupPath(own, func(c []string) bool { return len(c) == 1 && c[0] == "" })
	if !ok {
		return nil, errors.New("cgroup v2: toolgate's cgroup is not in /proc/self/cgroup")
	}
	base := filepath.Join("/sys/fs/cgroup", rel)
	ctrl, err := os.ReadFile(filepath.Join(base, "cgroup.controllers"))
	if err != nil || !bytes.Contains(append(append([]byte(" "), bytes.TrimSpace(ctrl)...), ' '), []byte(" cpu ")) {
		return nil, fmt.Errorf("cgroup v2: the cpu controller is not delegated to toolgate's cgroup %s", base)
	}
	// A cgroup with processes of its own cannot hand controllers to its
	// children: toolgate moves itself into a leaf first.
	self := filepath.Join(base, "toolgate-self")
	if err := os.Mkdir(self, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("cgroup v2: toolgate's cgroup %s is not writable (not delegated): %w", base, err)
	}
	if err := os.WriteFile(filepath.Join(self, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		return nil, fmt.Errorf("cgroup v2: moving toolgate into %s: %w", self, err)
	}
	if err := os.WriteFile(filepath.Join(base, "cgroup.subtree_control"), []byte("+cpu"), 0); err != nil {
		return nil, fmt.Errorf("cgroup v2: enabling the cpu controller under %s: %w", base, err)
	}
	dir := filepath.Join(base, "toolgate")
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("cgroup v2: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+cpu"), 0); err != nil {
		return nil, fmt.Errorf("cgroup v2: enabling the cpu controller under %s: %w", dir, err)
	}
	sweep(dir)
	return &CPUCgroup{Dir: dir, V2: true}, nil
}

var runSeq atomic.Uint64

// runGroup is one run's cgroup.
type runGroup struct {
	dir string
	v2  bool
	// forker, on v1, ends the thread the run was forked from: it must
	// outlive the run, whose parent-death signal is tied to that thread.
	forker chan struct{}
	moved  chan struct{} // closed once the forking thread has left
}

// newRun makes the cgroup of one run limited to millicores.
func (c *CPUCgroup) newRun(millicores int64) (*runGroup, error) {
	dir := filepath.Join(c.Dir, fmt.Sprintf("run-%d-%d", os.Getpid(), runSeq.Add(1)))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	g := &runGroup{dir: dir, v2: c.V2}
	quota := max(1000, millicores*cfsPeriod/1000) // the kernel's floor is 1 ms
	var err error
	if c.V2 {
		err = os.WriteFile(filepath.Join(dir, "cpu.max"), fmt.Appendf(nil, "%d %d", quota, cfsPeriod), 0)
	} else {
		err = os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte(strconv.Itoa(cfsPeriod)), 0)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.FormatInt(quota, 10)), 0)
		}
	}
	if err != nil {
		g.remove()
		return nil, err
	}
	return g, nil
}

// start starts cmd inside g, so that nothing it runs is ever outside it:
// on v2 the kernel clones it there (CLONE_INTO_CGROUP); on v1 it is forked
// from a thread moved into g first. That thread waits until remove, as the
// run's parent-death signal is tied to it, and then ends with its
// goroutine, never returning to the runtime's pool.
func (g *runGroup) start(cmd *exec.Cmd) error {
	if g.v2 {
		fd, err := os.Open(g.dir)
		if err != nil {
			return err
		}
		defer fd.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(fd.Fd())
		return cmd.Start()
	}
	errc := make(chan error, 1)
	g.forker, g.moved = make(chan struct{}), make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		if err := os.WriteFile(filepath.Join(g.dir, "tasks"), []byte(strconv.Itoa(unix.Gettid())), 0); err != nil {
			close(g.moved)
			errc <- err
			return
		}
		errc <- cmd.Start()
		<-g.forker
		// Back to toolgate's own cgroup, so that g can go at once rather
		// than when the runtime gets round to ending the thread.
		home := filepath.Dir(filepath.Dir(g.dir))
		_ = os.WriteFile(filepath.Join(home, "tasks"), []byte(strconv.Itoa(unix.Gettid())), 0)
		close(g.moved)
	}()
	return <-errc
}

// remove deletes g once the run's processes are gone (a killed process
// leaves its cgroup a moment after it is reaped).
func (g *runGroup) remove() {
	if g.forker != nil {
		close(g.forker)
		select {
		case <-g.moved:
		case <-time.After(time.Second):
		}
	}
	for range 50 {
		if !busy(g.dir) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Still busy: keep trying without holding up the call's result.
	go func() {
		for range 300 {
			time.Sleep(100 * time.Millisecond)
			if !busy(g.dir) {
				return
			}
		}
	}()
}

// busy removes dir and reports whether it is still in use.
func busy(dir string) bool {
	err := os.Remove(dir)
	return err != nil && errors.Is(err, syscall.EBUSY)
}

// sweep removes the run cgroups under dir left by toolgate processes that
// are gone (killed before they could remove them).
func sweep(dir string) {
	runs, _ := filepath.Glob(filepath.Join(dir, "run-*-*"))
	for _, r := range runs {
		pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(filepath.Base(r), "run-"), "-", 2)[0])
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue
		}
		_ = os.Remove(r)
	}
}
