package sandbox

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// foreverCPU stands in for "no CPU limit": a long-running process (an MCP
// server) accumulates CPU time over many calls, so the one-run default of
// CPU seconds = wall time would kill it after its first half-minute of work.
const foreverCPU = 10 * 365 * 24 * 3600

// Process is a long-running sandboxed command the caller talks to over its
// stdin and stdout, such as a stdio MCP server. It gets the confinement Run
// gives a one-shot tool (namespaces, read-only host, granted mounts, rlimits,
// a uid of its own under root) but no wall-time limit: it lives until Kill.
type Process struct {
	// Cmd is ready to start. The caller sets Stdin, Stdout and Stderr;
	// it must not change Path, Args, Env, Dir, SysProcAttr or ExtraFiles.
	Cmd   *exec.Cmd
	work  string
	uid   uint32 // from the pool when running as root, else 0
	undo  func() // takes back the uid's write access to read-write mounts
	proxy *proxy // the egress proxy of a networked process
	once  sync.Once
}

// NewProcess prepares spec as a long-running process. spec.Stdin,
// spec.Limits.Wall and spec.Limits.OutputBytes do not apply; CPU time is
// limited only when spec.Limits.CPUSeconds is set. Failures are E3101 with
// details.not_started.
func NewProcess(cfg Config, spec Spec) (*Process, error) {
	lim := spec.Limits
	if lim.CPUSeconds <= 0 {
		lim.CPUSeconds = foreverCPU
	}
	lim = lim.withDefaults()
	work, err := os.MkdirTemp(cfg.WorkDir, "toolgate-proc-")
	if err != nil {
		return nil, startErr(err)
	}
	p := &Process{work: work}
	asRoot := os.Geteuid() == 0
	if asRoot {
		p.uid = uids.get()
		if err := os.Chown(work, int(p.uid), int(p.uid)); err != nil {
			p.Kill()
			return nil, startErr(err)
		}
		if p.undo, err = grantWrites(cfg, spec.Mounts, p.uid); err != nil {
			p.Kill()
			return nil, err
		}
	}
	if egressed(cfg, spec) {
		if p.proxy, err = startProxy(cfg, spec.Egress, filepath.Join(work, "egress.sock"), p.uid); err != nil {
			p.Kill()
			return nil, startErr(err)
		}
	}
	argv, err := command(cfg, spec, lim, work)
	if err != nil {
		p.Kill()
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = environ(spec.Env)
	cmd.Dir = work
	// Its own process group, so Kill reaches everything it started; and
	// killed with its parent, so a crashed toolgate leaves no server behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if asRoot {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: p.uid, Gid: p.uid}
	}
	p.Cmd = cmd
	if err := withSeccomp(cfg, cmd); err != nil {
		p.Kill()
		return nil, startErr(err)
	}
	return p, nil
}

// Kill ends the process and everything in its group and removes its work
// directory. It is safe to call more than once, and before Start.
func (p *Process) Kill() {
	p.once.Do(func() {
		if p.Cmd != nil && p.Cmd.Process != nil {
			_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
		}
		if p.Cmd != nil {
			closeExtra(p.Cmd)
		}
		_ = os.RemoveAll(p.work)
		if p.undo != nil {
			p.undo()
		}
		if p.proxy != nil {
			p.proxy.close()
		}
		if p.uid != 0 {
			uids.put(p.uid)
		}
	})
}

// Stop asks the process to end with SIGTERM and kills its group when it has
// not exited within grace. exited must be closed when Wait has returned.
func (p *Process) Stop(exited <-chan struct{}, grace time.Duration) {
	if p.Cmd.Process != nil {
		_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(grace):
		}
	}
	p.Kill()
}

// StartErr is the error for a process that could not start (E3101 with
// details.not_started).
func StartErr(err error) error {
	if err == nil {
		err = errors.New("unknown reason")
	}
	return startErr(err)
}
