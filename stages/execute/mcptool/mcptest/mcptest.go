// Package mcptest finds and builds the MCP servers toolgate's tests run
// against: the reference servers from npm (installed by `make mcp-servers`)
// and flaky, a Go server whose tools misbehave on purpose.
package mcptest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// ServersEnv overrides where the npm servers are installed.
const ServersEnv = "TOOLGATE_MCP_SERVERS"

// RepoRoot is the directory holding go.mod, found from the working directory.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

// ServersDir is the npm install prefix of the reference servers:
// $TOOLGATE_MCP_SERVERS, or .cache/mcp-servers in the repository.
func ServersDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(ServersEnv)
	if dir == "" {
		dir = filepath.Join(RepoRoot(t), ".cache", "mcp-servers")
	}
	return dir
}

func server(t testing.TB, pkg string) (script, modules string) {
	t.Helper()
	modules = filepath.Join(ServersDir(t), "node_modules")
	script = filepath.Join(modules, "@modelcontextprotocol", pkg, "dist", "index.js")
	if _, err := os.Stat(script); err != nil {
		t.Fatalf("the MCP server %s is not installed at %s: run `make mcp-servers` (or set %s): %v",
			pkg, script, ServersEnv, err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("node is needed to run the MCP server %s: %v", pkg, err)
	}
	return script, modules
}

// Filesystem returns the entry script of @modelcontextprotocol/server-filesystem
// and the node_modules directory it runs from (bind it read-only).
func Filesystem(t testing.TB) (script, modules string) {
	t.Helper()
	return server(t, "server-filesystem")
}

// Everything returns the entry script of @modelcontextprotocol/server-everything
// and the node_modules directory it runs from.
func Everything(t testing.TB) (script, modules string) {
	t.Helper()
	return server(t, "server-everything")
}

// Flaky builds the flaky test server into a fresh directory nobody can read
// (the sandbox runs servers as nobody when tests run as root) and returns
// the binary's path.
func Flaky(t testing.TB) string {
	t.Helper()
	dir := Shared(t, t.TempDir())
	bin := filepath.Join(dir, "flaky")
	cmd := exec.Command("go", "build", "-o", bin, "./stages/execute/mcptool/testdata/flaky")
	cmd.Dir = RepoRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the flaky MCP server: %v\n%s", err, out)
	}
	return bin
}

// Shared makes dir and its parent reachable by other users, as a
// deployment's directories are, and returns dir.
func Shared(t testing.TB, dir string) string {
	t.Helper()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Roots are the directories tests allow servers' read_only_paths under
// (sandbox.Config.ReadOnlyRoots): the reference servers' install and the
// temporary directories test servers are built in.
func Roots(t testing.TB) []string {
	t.Helper()
	return []string{ServersDir(t), os.TempDir()}
}
