package sandbox

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// DeniedSyscalls fail with EPERM inside a bubblewrap sandbox: the kernel's
// attack surface a tool has no business with. bubblewrap installs the filter
// after it has made the sandbox (its own mounts and namespaces), just before
// it runs the tool, so only the tool and its children are bound.
//   - debugging other processes and reading their memory: ptrace,
//     process_vm_readv, process_vm_writev;
//   - mounts and namespaces (a fresh user namespace would give the tool
//     capabilities there, the way most kernel escalations begin): mount,
//     umount2, pivot_root, the new mount API, unshare, setns (a user
//     namespace made by clone is refused by bubblewrap's --disable-userns);
//   - the kernel itself: modules, kexec, bpf, perf_event_open, keyrings,
//     userfaultfd (a race amplifier in exploits), reboot, swap, acct,
//     quotactl, syslog, port I/O, file handles (open_by_handle_at escaped
//     Docker's first sandbox).
var DeniedSyscalls = []string{
	"ptrace", "process_vm_readv", "process_vm_writev",
	"mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
	"mount_setattr", "unshare", "setns",
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	"bpf", "perf_event_open", "keyctl", "add_key", "request_key", "userfaultfd",
	"reboot", "swapon", "swapoff", "acct", "quotactl", "syslog", "iopl", "ioperm",
	"open_by_handle_at", "name_to_handle_at", "lookup_dcookie",
}

// seccompFD is the descriptor bubblewrap reads the filter from: the first
// of exec.Cmd.ExtraFiles.
const seccompFD = 3

// seccompProgram is the filter as bubblewrap reads it: struct sock_filter
// entries in the host's byte order. Calls of another architecture's ABI
// (i386 through int 0x80 on x86_64) are killed, since the deny list names
// this architecture's numbers only.
var seccompProgram = sync.OnceValues(func() ([]byte, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	policy := seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionErrno, Names: DeniedSyscalls},
		},
	}
	body, err := policy.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	const archOffset = 4 // struct seccomp_data: int nr; __u32 arch; ...
	prog := append([]bpf.Instruction{
		bpf.LoadAbsolute{Off: archOffset, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_PROCESS},
	}, body...)
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	out := make([]byte, 0, 8*len(raw))
	for _, r := range raw {
		out = binary.NativeEndian.AppendUint16(out, r.Op)
		out = append(out, r.Jt, r.Jf)
		out = binary.NativeEndian.AppendUint32(out, r.K)
	}
	return out, nil
})

// seccompFile returns a pipe's read end holding the filter, for
// exec.Cmd.ExtraFiles; the caller closes it once the command has started.
func seccompFile() (*os.File, error) {
	prog, err := seccompProgram()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	// The program is a few hundred bytes, well within a pipe's buffer.
	_, err = w.Write(prog)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}
