// Package sandbox runs command-line tools as confined subprocesses.
//
// In the default mode, bwrap, a tool runs under bubblewrap: a new session,
// every namespace unshared (no network unless granted), a read-only view of
// /usr and the dynamic linker's files and nothing else of the host, a
// private writable work directory, and only the granted paths of the file
// root, bound read-only or read-write. When toolgate runs as root the tool
// runs under a uid of its own (see UIDBase), so that rlimits bind it:
// address space, CPU time, file size, open files and process count
// (RLIMIT_NPROC does not apply to root, and counts per uid).
// The whole process tree is killed on timeout, on cancel and when an output
// cap is passed.
//
// Mode none runs the command directly, with the same limits and caps but no
// isolation: an operator must choose it explicitly, for hosts where
// bubblewrap cannot run. docs/sandbox.md says what each mode protects.
package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/toolgate/toolgate/api"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// RuleOptionInjection is the rule an operand beginning with a dash breaks
// (detect.RuleOptionInjection).
const RuleOptionInjection = "shell.option_injection"

// Modes.
const (
	ModeBwrap = "bwrap"
	ModeNone  = "none"
)

// nobody is the uid tools share when the pool of run uids is exhausted.
const nobody = 65534

// Defaults for limits a manifest leaves unset.
const (
	DefaultMemoryMB    = 1024 // tools.DefaultMemoryMB, the specification's
	DefaultPIDs        = 64
	DefaultOutputBytes = 1 << 20
	DefaultFileSizeMB  = 64
	stderrBytes        = 64 << 10
)

// Config is how the execute stage runs tools.
type Config struct {
	Mode string // ModeBwrap (default) or ModeNone
	// FileRoot is the directory granted paths are relative to.
	FileRoot string
	// WorkDir is where private work directories are made; default os.TempDir.
	WorkDir string
	// ReadOnlyRoots are the host directories read-only paths (an MCP
	// server's install) must lie under once resolved; empty: the file root.
	ReadOnlyRoots []string
	// EgressDial dials for the egress proxy of networked runs; default one
	// refusing loopback, private and link-local addresses. Tests map names
	// to local servers with it.
	EgressDial func(ctx context.Context, network, addr string) (net.Conn, error)
	// CPU, when set, gives each run with a CPU share a cgroup applying it
	// (DetectCPU); CPUErr says why there is none.
	CPU    *CPUCgroup
	CPUErr error
}

// Mount is a granted path: Host (absolute) appears at Path in the sandbox.
type Mount struct {
	Host, Path string
	Write      bool
}

// Spec is one run.
type Spec struct {
	Argv    []string
	Stdin   []byte
	Env     map[string]string
	Network bool
	// Egress, with Network, gives the run a network namespace of its own
	// whose only way out is a proxy admitting the hosts Egress allows;
	// without it a networked run shares the worker's network.
	Egress *Egress
	Mounts []Mount
	Limits Limits
	// Files are written into the private work directory (/work) before
	// the tool starts, by name.
	Files map[string][]byte
	// Control, when set, receives the tool's control lines (see
	// ControlPrefix) as they are written; they are not part of Stdout.
	// It runs on the goroutine reading stdout, so a slow Control slows
	// the tool's writes, not the other way round.
	Control func(verb string, arg []byte)
}

// ControlPrefix starts a line of the control protocol on a tool's stdout:
//
//	toolgate:progress 40 parsed 4 of 10 files
//	toolgate:checkpoint {"next_file": 5}
//
// A line is one verb and its argument; everything else on stdout is the
// tool's result.
const ControlPrefix = "toolgate:"

// Limits bound one run. Zero values take the defaults (CPU time defaults to
// the wall time).
type Limits struct {
	Wall        time.Duration
	MemoryMB    int64
	CPUSeconds  int64
	PIDs        int64
	OutputBytes int64
	FileSizeMB  int64
	// TmpMB bounds each of the private /tmp and /work, which are memory
	// (tmpfs); default the memory limit.
	TmpMB int64
	// CPUMillicores is the run's CPU share, applied where Config.CPU is.
	CPUMillicores int64
}

// Result is what a run produced.
type Result struct {
	Stdout   []byte
	Stderr   []byte
	ExitCode int
	// CPU is the user and system time of the run's processes (those the
	// sandbox waited for), and MaxRSSKB the largest resident set among
	// them, from the kernel's accounting at exit.
	CPU      time.Duration
	MaxRSSKB int64
	// NetIn and NetOut are the bytes the run's egress proxy carried from
	// and to the hosts it reached.
	NetIn, NetOut int64
	// CPUShare reports whether Limits.CPUMillicores was applied.
	CPUShare bool
}

// Available reports whether bubblewrap can make a sandbox on this host.
func Available() error {
	if _, err := exec.LookPath("prlimit"); err != nil {
		return errors.New("prlimit (util-linux) is not installed")
	}
	path, err := exec.LookPath("bwrap")
	if err != nil {
		return errors.New("bubblewrap (bwrap) is not installed")
	}
	out, err := exec.Command(path, "--unshare-all", "--unshare-user", "--disable-userns", "--ro-bind", "/", "/", "true").CombinedOutput()
	if err != nil {
		return fmt.Errorf("bubblewrap cannot make a sandbox here: %v: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// Run runs spec and returns its output. Failures are *api.Error:
// E3101 the sandbox could not start, E3102 a limit was hit (memory, CPU,
// file size, processes, output), E3103 the wall time passed, E3107 the tool
// was killed by a signal, E3108 it exited non-zero. ctx's cancellation kills
// the whole tree and returns ctx's error.
func Run(ctx context.Context, cfg Config, spec Spec) (Result, error) {
	lim := spec.Limits.withDefaults()
	work, err := os.MkdirTemp(cfg.WorkDir, "toolgate-run-")
	if err != nil {
		return Result{}, startErr(err)
	}
	defer os.RemoveAll(work)
	asRoot := os.Geteuid() == 0
	var uid uint32
	if asRoot {
		uid = uids.get()
		defer uids.put(uid)
		if err := os.Chown(work, int(uid), int(uid)); err != nil {
			return Result{}, startErr(err)
		}
	}
	for name, data := range spec.Files {
		f := filepath.Join(work, filepath.Base(name))
		if err := os.WriteFile(f, data, 0o644); err != nil {
			return Result{}, startErr(err)
		}
		if asRoot {
			_ = os.Chown(f, int(uid), int(uid))
		}
	}
	if asRoot {
		for _, m := range spec.Mounts {
			if err := reachable(m.Host, uid); err != nil {
				return Result{}, err
			}
		}
		undo, err := grantWrites(cfg, spec.Mounts, uid)
		if err != nil {
			return Result{}, err
		}
		defer undo()
	}
	var px *proxy
	if egressed(cfg, spec) {
		if px, err = startProxy(cfg, spec.Egress, filepath.Join(work, "egress.sock"), uid); err != nil {
			return Result{}, startErr(err)
		}
		defer px.close()
	}
	argv, err := command(cfg, spec, lim, work)
	if err != nil {
		return Result{}, err
	}
	runCtx, cancel := context.WithTimeout(ctx, lim.Wall)
	defer cancel()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = environ(spec.Env)
	cmd.Dir = work
	cmd.Stdin = bytes.NewReader(spec.Stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if asRoot {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: uid}
	}
	stdout := &capped{limit: lim.OutputBytes}
	stderr := &capped{limit: stderrBytes, quiet: true}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	var lines *lineFilter
	if spec.Control != nil {
		lines = &lineFilter{out: stdout, control: spec.Control}
		cmd.Stdout = lines
	}
	stdout.over = cancel // a flood ends the run at once
	if err := withSeccomp(cfg, cmd); err != nil {
		return Result{}, startErr(err)
	}
	var group *runGroup
	if cfg.CPU != nil && lim.CPUMillicores > 0 {
		if group, err = cfg.CPU.newRun(lim.CPUMillicores); err != nil {
			return Result{}, startErr(fmt.Errorf("making the run's cgroup: %w", err))
		}
		defer group.remove()
		err = group.start(cmd)
	} else {
		err = cmd.Start()
	}
	closeExtra(cmd)
	if err != nil {
		return Result{}, startErr(err)
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-runCtx.Done():
			// The whole group: bwrap, and with it the sandbox's pid namespace.
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		case <-done:
		}
	}()
	werr := cmd.Wait()
	close(done)
	if lines != nil {
		lines.flush()
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // anything left in the group
	res := Result{Stdout: stdout.buf.Bytes(), Stderr: stderr.buf.Bytes(), ExitCode: cmd.ProcessState.ExitCode(), CPUShare: group != nil}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		res.CPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		res.MaxRSSKB = ru.Maxrss
	}
	if px != nil {
		px.close() // its tunnels end, so the counts are whole
		res.NetIn, res.NetOut = px.in.Load(), px.out.Load()
	}
	switch {
	case stdout.exceeded:
		return res, api.NewError(api.SandboxFailure, api.EResourceLimit,
			"the tool wrote more than %d bytes to stdout and was stopped", lim.OutputBytes).WithDetail("limit", "output_bytes")
	case ctx.Err() != nil:
		return res, ctx.Err()
	case runCtx.Err() != nil:
		return res, api.NewError(api.Timeout, api.ETimeout, "the tool ran past its %v wall-time limit and was killed", lim.Wall).AsRetryable()
	}
	return res, exitErr(werr, cmd.ProcessState, stderr.buf.Bytes())
}

// egressed reports whether spec runs networked behind the egress proxy.
func egressed(cfg Config, spec Spec) bool {
	return spec.Network && spec.Egress != nil && cfg.Mode != ModeNone
}

// grantWrites gives uid write access to the read-write mounts of a run
// (grantWrite); the returned function takes it away.
func grantWrites(cfg Config, mounts []Mount, uid uint32) (func(), error) {
	var undos []func()
	undo := func() {
		for _, u := range undos {
			u()
		}
	}
	if cfg.Mode == ModeNone {
		return undo, nil
	}
	for _, m := range mounts {
		if !m.Write {
			continue
		}
		u, err := grantWrite(m.Host, uid)
		if err != nil {
			undo()
			return nil, startErr(err)
		}
		undos = append(undos, u)
	}
	return undo, nil
}

// withSeccomp hands bubblewrap the seccomp filter (DeniedSyscalls) as
// cmd's first extra file, seccompFD.
func withSeccomp(cfg Config, cmd *exec.Cmd) error {
	if cfg.Mode == ModeNone {
		return nil
	}
	f, err := seccompFile()
	if err != nil {
		return err
	}
	cmd.ExtraFiles = []*os.File{f}
	return nil
}

// closeExtra closes the parent's copies of cmd's extra files once the child
// holds its own.
func closeExtra(cmd *exec.Cmd) {
	for _, f := range cmd.ExtraFiles {
		_ = f.Close()
	}
}

func (l Limits) withDefaults() Limits {
	if l.Wall <= 0 {
		l.Wall = 30 * time.Second
	}
	if l.MemoryMB <= 0 {
		l.MemoryMB = DefaultMemoryMB
	}
	if l.CPUSeconds <= 0 {
		l.CPUSeconds = int64(max(1, l.Wall.Seconds()))
	}
	if l.PIDs <= 0 {
		l.PIDs = DefaultPIDs
	}
	if l.OutputBytes <= 0 {
		l.OutputBytes = DefaultOutputBytes
	}
	if l.FileSizeMB <= 0 {
		l.FileSizeMB = DefaultFileSizeMB
	}
	if l.TmpMB <= 0 {
		l.TmpMB = l.MemoryMB
	}
	return l
}

// command builds the argv: prlimit sets the rlimits and execs bwrap (or the
// tool itself in mode none).
func command(cfg Config, spec Spec, lim Limits, work string) ([]string, error) {
	if len(spec.Argv) == 0 {
		return nil, startErr(errors.New("empty command"))
	}
	as := "--as=" + strconv.FormatInt(lim.MemoryMB<<20, 10)
	argv := []string{"prlimit", as,
		"--cpu=" + strconv.FormatInt(lim.CPUSeconds, 10),
		"--fsize=" + strconv.FormatInt(lim.FileSizeMB<<20, 10),
		"--nofile=256",
		"--core=0",
	}
	if os.Geteuid() == 0 {
		argv = append(argv, "--nproc="+strconv.FormatInt(lim.PIDs, 10))
	}
	if egressed(cfg, spec) {
		argv = slices.DeleteFunc(argv, func(a string) bool { return a == as })
	}
	argv = append(argv, "--")
	switch cfg.Mode {
	case ModeNone:
		return append(argv, spec.Argv...), nil
	case ModeBwrap, "":
	default:
		return nil, startErr(fmt.Errorf("unknown sandbox mode %q", cfg.Mode))
	}
	size := strconv.FormatInt(lim.TmpMB<<20, 10)
	files := slices.Sorted(maps.Keys(spec.Files))
	for i, name := range files {
		files[i] = filepath.Base(name)
	}
	// --as-pid-1: the tool itself is the namespace's init. bwrap's own init
	// would outlive the bwrap we wait for, be orphaned to the host's init,
	// and count against the tool user's process limit until reaped.
	argv = append(argv, "bwrap",
		"--die-with-parent", "--new-session", "--unshare-all", "--as-pid-1",
		// No user namespace inside: clone(CLONE_NEWUSER) is how most
		// kernel escalations start, and the seccomp filter sees only unshare.
		"--unshare-user", "--disable-userns",
		"--seccomp", strconv.Itoa(seccompFD),
		"--ro-bind", "/usr", "/usr",
		"--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
		"--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
		"--proc", "/proc", "--dev", "/dev",
		// /tmp and /work are memory, outside the address-space limit: each
		// gets a size, or a tool could hold the host's RAM in files.
		"--size", size, "--tmpfs", "/tmp",
		"--size", size, "--tmpfs", "/work",
	)
	for _, name := range files {
		argv = append(argv, "--ro-bind", filepath.Join(work, name), "/work/"+name)
	}
	argv = append(argv, "--chdir", "/work",
		"--setenv", "HOME", "/work", "--setenv", "TMPDIR", "/tmp",
	)
	for _, f := range []string{"/etc/ld.so.cache", "/etc/alternatives", "/etc/ssl/certs", "/etc/resolv.conf", "/etc/hosts"} {
		if _, err := os.Stat(f); err == nil {
			argv = append(argv, "--ro-bind", f, f)
		}
	}
	if egressed(cfg, spec) {
		fwd, err := forwarderBinary()
		if err != nil {
			return nil, startErr(err)
		}
		proxyURL := "http://127.0.0.1:" + strconv.Itoa(ProxyPort)
		argv = append(argv, "--bind", filepath.Join(work, "egress.sock"), egressSocket,
			"--ro-bind", fwd, forwarderPath, "--setenv", forwarderEnv, "1")
		for _, k := range []string{"HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY"} {
			argv = append(argv, "--setenv", k, proxyURL)
		}
		argv = append(argv, "--setenv", "NO_PROXY", "", "--setenv", "no_proxy", "")
	} else if spec.Network {
		argv = append(argv, "--share-net")
	}
	for _, m := range spec.Mounts {
		mode := "--ro-bind"
		if m.Write {
			mode = "--bind"
		}
		argv = append(argv, mode, m.Host, m.Path)
	}
	// The sandbox's own root is a tmpfs: made read-only last, so that only
	// /work, /tmp and read-write grants take writes.
	argv = append(argv, "--remount-ro", "/", "--")
	if egressed(cfg, spec) {
		// The Go runtime of the forwarder reserves more address space
		// than a tool's limit may allow: the tool gets its limit from a
		// prlimit of its own, beneath the forwarder.
		argv = append(argv, forwarderPath, "prlimit", as, "--")
	}
	return append(argv, spec.Argv...), nil
}

// Mounts maps granted paths (relative to the file root, "/" the whole root)
// to binds under /files, refusing any that leave the root through a link.
func Mounts(fileRoot string, paths []string, write bool) ([]Mount, error) {
	if fileRoot == "" || len(paths) == 0 {
		return nil, nil
	}
	// bwrap takes a relative bind source relative to its own working
	// directory, the run's private one: every path it gets is absolute.
	root, err := filepath.Abs(fileRoot)
	if err == nil {
		root, err = filepath.EvalSymlinks(root)
	}
	if err != nil {
		return nil, fmt.Errorf("file root: %w", err)
	}
	var out []Mount
	for _, p := range paths {
		rel := strings.TrimPrefix(filepath.Clean("/"+p), "/")
		host, err := filepath.EvalSymlinks(filepath.Join(root, rel))
		if err != nil {
			continue // nothing there to bind
		}
		if r, err := filepath.Rel(root, host); err != nil || r == ".." || strings.HasPrefix(r, "../") {
			return nil, api.NewError(api.PermissionDenied, api.EPathOutsideRoots, "granted path %s leads outside the file root", p)
		}
		out = append(out, Mount{Host: host, Path: filepath.Join("/files", rel), Write: write})
	}
	return out, nil
}

func environ(extra map[string]string) []string {
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "HOME=/work"}
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}

func startErr(err error) error {
	return api.WrapError(err, api.SandboxFailure, api.EExecutorUnavailable, "the sandbox could not start: %v", err).
		WithDetail("not_started", true)
}

// exitErr maps how the process ended to an error, or nil for exit 0.
func exitErr(werr error, st *os.ProcessState, stderr []byte) error {
	if werr == nil {
		return nil
	}
	var ee *exec.ExitError
	if !errors.As(werr, &ee) || st == nil {
		return api.WrapError(werr, api.SandboxFailure, api.ESandboxCrashed, "the tool could not be waited for: %v", werr)
	}
	tail := lastLine(stderr)
	if memoryExhausted(stderr) {
		return api.NewError(api.SandboxFailure, api.EResourceLimit, "the tool ran out of its memory limit%s", tail).WithDetail("limit", "memory_mb")
	}
	if bytes.Contains(stderr, []byte("No space left on device")) {
		return api.NewError(api.SandboxFailure, api.EResourceLimit, "the tool filled its /tmp or /work (tmp_mb)%s", tail).WithDetail("limit", "tmp_mb")
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		switch sig := ws.Signal(); sig {
		case syscall.SIGXCPU:
			return api.NewError(api.SandboxFailure, api.EResourceLimit, "the tool used up its CPU time").WithDetail("limit", "cpu_seconds")
		case syscall.SIGXFSZ:
			return api.NewError(api.SandboxFailure, api.EResourceLimit, "the tool wrote a file over its size limit").WithDetail("limit", "file_size_mb")
		default:
			return api.NewError(api.SandboxFailure, api.ESandboxCrashed, "the tool was killed by %v%s", sig, tail)
		}
	}
	code := st.ExitCode()
	// bwrap and the shell report a signal-killed child as 128+signal.
	if code > 128 && code <= 128+64 {
		switch syscall.Signal(code - 128) {
		case syscall.SIGXCPU, syscall.SIGKILL:
			return api.NewError(api.SandboxFailure, api.EResourceLimit, "the tool was stopped by a resource limit (signal %d)%s", code-128, tail)
		case syscall.SIGXFSZ:
			return api.NewError(api.SandboxFailure, api.EResourceLimit, "the tool wrote a file over its size limit")
		}
		return api.NewError(api.SandboxFailure, api.ESandboxCrashed, "the tool died of signal %d%s", code-128, tail)
	}
	return api.NewError(api.ToolExecutionError, api.EToolFailed, "the tool exited with status %d%s", code, tail).WithDetail("exit_code", code)
}

// memoryExhausted recognises the messages of a process whose allocations
// the address-space limit refused.
func memoryExhausted(stderr []byte) bool {
	s := strings.ToLower(string(stderr))
	return strings.Contains(s, "memory exhausted") || strings.Contains(s, "cannot allocate memory") ||
		strings.Contains(s, "out of memory")
}

func lastLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 300 {
		s = s[:300]
	}
	if s == "" {
		return ""
	}
	return ": " + s
}

// capped keeps the first limit bytes written to it and notes an overflow.
type capped struct {
	buf      bytes.Buffer
	limit    int64
	exceeded bool
	quiet    bool // drop the excess instead of stopping the run
	over     func()
}

func (c *capped) Write(p []byte) (int, error) {
	room := c.limit - int64(c.buf.Len())
	if int64(len(p)) > room {
		c.buf.Write(p[:max(room, 0)])
		if !c.quiet && !c.exceeded {
			c.exceeded = true
			if c.over != nil {
				c.over()
			}
		}
		return len(p), nil // keep draining so the writer never blocks
	}
	return c.buf.Write(p)
}

var _ io.Writer = (*capped)(nil)

// lineFilter splits a tool's stdout into control lines, handed to control,
// and the rest, passed to out. A partial line is held until its newline,
// but never more than out's limit of it, so a flood without newlines still
// trips the output cap.
type lineFilter struct {
	out     *capped
	control func(verb string, arg []byte)
	line    []byte
}

func (f *lineFilter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			f.line = append(f.line, p...)
			if int64(len(f.line)) > f.out.limit {
				_, _ = f.out.Write(f.line)
				f.line = f.line[:0]
			}
			break
		}
		f.line = append(f.line, p[:i+1]...)
		p = p[i+1:]
		f.emit()
	}
	return n, nil
}

func (f *lineFilter) emit() {
	if rest, ok := bytes.CutPrefix(f.line, []byte(ControlPrefix)); ok {
		rest = bytes.TrimSpace(rest)
		verb, arg, _ := bytes.Cut(rest, []byte(" "))
		f.control(string(verb), bytes.TrimSpace(arg))
	} else {
		_, _ = f.out.Write(f.line)
	}
	f.line = f.line[:0]
}

// flush handles a last line without a newline.
func (f *lineFilter) flush() {
	if len(f.line) > 0 {
		f.emit()
	}
}

// Expand fills an argv template from the parameters: an element that is
// exactly {{name}} becomes the top-level parameter name, as one argument,
// whatever it contains. Nothing is interpreted by a shell. A parameter named
// in operands is refused (invalid_parameters, E3018, rule
// shell.option_injection) when its value begins with "-": the program would
// read it as an option ("--upload-pack=..." to git).
func Expand(template []string, params json.RawMessage, operands ...string) ([]string, error) {
	var obj map[string]any
	if err := json.Unmarshal(params, &obj); err != nil && len(params) > 0 {
		return nil, api.NewError(api.InvalidParameters, api.EParametersInvalid, "parameters are not an object")
	}
	out := make([]string, 0, len(template))
	for _, el := range template {
		name, ok := strings.CutPrefix(el, "{{")
		if name, ok2 := strings.CutSuffix(name, "}}"); ok && ok2 {
			v, found := obj[name]
			if !found {
				return nil, api.NewError(api.InvalidParameters, api.EParametersInvalid, "parameter %q is needed for the command", name)
			}
			switch v := v.(type) {
			case string:
				if strings.HasPrefix(v, "-") && slices.Contains(operands, name) {
					return nil, api.NewError(api.InvalidParameters, api.EInputRuleFired,
						"parameter %q is an operand of the command and must not begin with a dash, which would make it an option", name).
						WithDetail("parameter", name).WithDetail("rule", RuleOptionInjection)
				}
				out = append(out, v)
			case float64, bool:
				b, _ := json.Marshal(v)
				out = append(out, string(b))
			default:
				return nil, api.NewError(api.InvalidParameters, api.EParametersInvalid, "parameter %q must be a string, number or boolean to be an argument", name)
			}
			continue
		}
		out = append(out, el)
	}
	return out, nil
}
