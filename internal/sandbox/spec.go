package sandbox

import (
	"cmp"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"path/filepath"
	"slices"
	"strings"
)

// Request is what one tool asks of a sandbox, in the terms every kind that
// runs a process shares (cli tools, stdio MCP servers). Build turns it, the
// manifest and the call's grants into a Spec: the one place where
// permissions become mounts, network and limits.
type Request struct {
	Manifest *tools.Manifest
	// Grants are what the capability token allows (authorize's derivation).
	Grants envelope.Grants
	Argv   []string
	Env    map[string]string
	// Network is the kind's own request for the network (cli.network,
	// mcp.network); the manifest's network permissions ask for it too.
	Network bool
	// ReadOnlyPaths are host paths bound read-only at the same place (an
	// MCP server's install). Each is resolved, symlinks included, and must
	// lie under one of Config.ReadOnlyRoots.
	ReadOnlyPaths []string
	// Defaults are the kind's limits for what the manifest leaves unset.
	Defaults Limits
}

// Build makes the Spec of r under cfg:
//   - network only when the manifest asks for it and the token grants hosts;
//   - each filesystem permission of the manifest bound under /files,
//     read-write only when both it and the token's grant say rw;
//   - read-only paths resolved and confined to cfg.ReadOnlyRoots;
//   - limits from the manifest, else r.Defaults, else the package defaults.
//
// Wall time and a request's narrowing of limits are the caller's. Failures
// are *api.Error.
func (cfg Config) Build(r Request) (Spec, error) {
	m := r.Manifest
	spec := Spec{Argv: r.Argv, Env: r.Env}
	if (r.Network || len(m.Permissions.Network) > 0) && len(r.Grants.Hosts) > 0 {
		spec.Network = true
		spec.Egress = &Egress{Allow: allowHosts(m.Permissions.Network, r.Grants)}
	}
	for _, p := range r.ReadOnlyPaths {
		mt, err := cfg.readOnly(p)
		if err != nil {
			return Spec{}, err
		}
		spec.Mounts = append(spec.Mounts, mt)
	}
	for _, p := range m.Permissions.Filesystem {
		write := p.Mode == "rw" && r.Grants.PathMode == "rw"
		ms, err := Mounts(cfg.FileRoot, []string{p.Path}, write)
		if err != nil {
			return Spec{}, err
		}
		spec.Mounts = append(spec.Mounts, ms...)
	}
	d := r.Defaults
	spec.Limits = Limits{
		MemoryMB:    cmp.Or(m.Limits.MemoryMB, d.MemoryMB),
		CPUSeconds:  cmp.Or(m.Limits.CPUSeconds, d.CPUSeconds),
		PIDs:        cmp.Or(m.Limits.PIDs, d.PIDs),
		OutputBytes: cmp.Or(m.Limits.OutputBytes, d.OutputBytes),
		FileSizeMB:  cmp.Or(m.Limits.FileSizeMB, d.FileSizeMB),
		TmpMB:       cmp.Or(m.Limits.TmpMB, d.TmpMB),
		// The specification's 500 millicores where the manifest is silent.
		CPUMillicores: m.CPUMillicores(),
	}
	return spec, nil
}

// readOnly resolves a read-only host path and checks it lies under one of
// the configured roots, by whole components, after both are resolved: a
// symlink planted under an allowed root cannot lead the bind elsewhere.
func (cfg Config) readOnly(p string) (Mount, error) {
	deny := func(format string, args ...any) error {
		return api.NewError(api.PermissionDenied, api.EPathOutsideRoots, format, args...).
			WithDetail("path", p).WithDetail("not_started", true)
	}
	if !filepath.IsAbs(p) {
		return Mount{}, deny("read-only path %s is not absolute", p)
	}
	host, err := filepath.EvalSymlinks(filepath.Clean(p))
	if err != nil {
		return Mount{}, api.NewError(api.ToolExecutionError, api.EExecutorUnavailable,
			"read-only path %s: %v", p, err).WithDetail("not_started", true)
	}
	if host == "/" {
		return Mount{}, deny("read-only path %s would expose the whole host", p)
	}
	for _, bad := range hostInterfaces {
		if under(host, bad) {
			return Mount{}, deny("read-only path %s (resolved to %s) is under %s, which is never bound into a sandbox", p, host, bad)
		}
	}
	roots := cfg.readOnlyRoots()
	for _, root := range roots {
		if under(host, root) {
			return Mount{Host: host, Path: filepath.Clean(p)}, nil
		}
	}
	return Mount{}, deny("read-only path %s (resolved to %s) is not under a directory the operator allows for servers (%s; see --mcp-path-roots)",
		p, host, strings.Join(roots, ", "))
}

// readOnlyRoots are cfg.ReadOnlyRoots, or the file root when none is set,
// each resolved; roots that do not exist are left out.
func (cfg Config) readOnlyRoots() []string {
	list := cfg.ReadOnlyRoots
	if len(list) == 0 && cfg.FileRoot != "" {
		list = []string{cfg.FileRoot}
	}
	var out []string
	for _, r := range list {
		abs, err := filepath.Abs(r)
		if err != nil {
			continue
		}
		if res, err := filepath.EvalSymlinks(abs); err == nil {
			out = append(out, res)
		}
	}
	return out
}

// under reports whether p lies in dir, comparing whole components.
func under(p, dir string) bool {
	if dir == "/" {
		return true
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// allowHosts is a networked run's allowlist: a host and port the token
// grants (token.HostAllowed, its ports if it lists any) and, when the
// manifest lists network permissions, one of those too.
func allowHosts(declared []tools.NetworkPermission, g envelope.Grants) func(string, int) bool {
	return func(host string, port int) bool {
		host = strings.ToLower(host)
		granted := slices.ContainsFunc(g.Hosts, func(p string) bool { return token.HostAllowed(p, host) }) &&
			(len(g.Ports) == 0 || slices.Contains(g.Ports, port))
		listed := len(declared) == 0 || slices.ContainsFunc(declared, func(n tools.NetworkPermission) bool {
			return token.HostAllowed(n.Host, host) && (n.Port == 0 || n.Port == port)
		})
		return granted && listed
	}
}

// hostInterfaces hold the host's kernel interfaces, devices and sockets:
// never bound into a sandbox, whatever path leads to them.
var hostInterfaces = []string{"/proc", "/sys", "/dev", "/run", "/var/run"}
