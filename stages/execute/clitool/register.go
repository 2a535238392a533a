package clitool

import "github.com/toolgate/toolgate/stages/execute/kind"

// Registration declares the cli kind: commands run in the process's
// sandbox. A call needs what the manifest's permissions declare, no more.
var Registration = kind.Kind{
	Name: "cli",
	New: func(d *kind.Deps) (kind.Runner, error) {
		return &Kind{Sandbox: d.Sandbox, SandboxErr: d.SandboxErr}, nil
	},
}
