package mcpfront_test

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/token"
)

// inspector is the MCP Inspector's launcher that `make mcp-servers`
// installs, or "" when it is not installed.
func inspector(t *testing.T) string {
	dir := cmp.Or(os.Getenv("TOOLGATE_MCP_SERVERS"), filepath.Join("..", "..", ".cache", "mcp-servers"))
	p, err := filepath.Abs(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "inspector", "clients", "launcher", "build", "index.js"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// buildToolgate builds the toolgate binary once per test.
func buildToolgate(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "toolgate")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/toolgate/toolgate/cmd/toolgate")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building toolgate: %v\n%s", err, out)
	}
	return bin
}

func runInspector(t *testing.T, launcher string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{launcher, "--cli"}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("inspector %v: %v\nstdout: %s\nstderr: %s", args, err, out.String(), errb.String())
	}
	return out.String()
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestInspector: the MCP Inspector's CLI lists and calls toolgate's tools
// through `toolgate mcp --stdio` and `toolgate mcp --listen`.
func TestInspector(t *testing.T) {
	launcher := inspector(t)
	if launcher == "" {
		t.Skip("the MCP Inspector is not installed: run `make mcp-servers`")
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed")
	}
	e := newEnv(t)
	bin := buildToolgate(t)
	jwks, err := testKey().PublicJWKS()
	if err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(keys, jwks, 0o600); err != nil {
		t.Fatal(err)
	}
	tok := mint(t, token.Claims{})
	check := func(t *testing.T, list, call string) {
		t.Helper()
		if !strings.Contains(list, `"t.echo"`) || strings.Contains(list, `"other.tool"`) || !strings.Contains(list, `"readOnlyHint": true`) {
			t.Errorf("tools/list:\n%s", list)
		}
		if !strings.Contains(call, `"structuredContent"`) || !strings.Contains(call, `"message": "from the inspector"`) {
			t.Errorf("tools/call:\n%s", call)
		}
	}

	t.Run("stdio", func(t *testing.T) {
		target := []string{"-e", "TOOLGATE_TOKEN=" + tok, "--", bin, "mcp", "--stdio", "--nats", e.url, "--jwks", keys, "--log-level", "warn"}
		list := runInspector(t, launcher, append([]string{"--method", "tools/list"}, target...)...)
		call := runInspector(t, launcher, append([]string{"--method", "tools/call", "--tool-name", "t.echo",
			"--tool-arg", "message=from the inspector"}, target...)...)
		check(t, list, call)
	})

	t.Run("http", func(t *testing.T) {
		addr := freePort(t)
		ctx, cancel := context.WithCancel(context.Background())
		srv := exec.CommandContext(ctx, bin, "mcp", "--listen", addr, "--nats", e.url, "--jwks", keys, "--log-level", "warn")
		srv.Stderr = os.Stderr
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); _ = srv.Wait() })
		eventually(t, 20*time.Second, "toolgate mcp --listen to accept connections", func() bool {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				c.Close()
			}
			return err == nil
		})
		url := fmt.Sprintf("http://%s/mcp", addr)
		auth := "Authorization: Bearer " + tok
		list := runInspector(t, launcher, url, "--transport", "http", "--header", auth, "--method", "tools/list")
		call := runInspector(t, launcher, url, "--transport", "http", "--header", auth, "--method", "tools/call",
			"--tool-name", "t.echo", "--tool-arg", "message=from the inspector")
		check(t, list, call)
	})
}
