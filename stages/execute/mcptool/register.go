package mcptool

import (
	"cmp"

	"github.com/toolgate/toolgate/stages/execute/kind"
)

// Registration declares the mcp kind. Its settings are a Config among the
// Deps' settings (supervision); stdio servers run in the process's sandbox.
var Registration = kind.Kind{
	Name: "mcp",
	New: func(d *kind.Deps) (kind.Runner, error) {
		cfg, _ := kind.Setting[Config](d)
		cfg.Sandbox, cfg.SandboxErr, cfg.Log = d.Sandbox, d.SandboxErr, cmp.Or(cfg.Log, d.Log)
		k := New(cfg)
		d.Release(func() { _ = k.Close() })
		return k, nil
	},
}
