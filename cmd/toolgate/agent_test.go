package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
)

// asMain makes the test binary the toolgate command, so a test can run it as
// a separate process (a desktop MCP client launching `toolgate mcp --stdio`)
// without building it.
const asMain = "TOOLGATE_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMain) == "1" {
		main()
	}
	os.Exit(m.Run())
}

// toolgateCmd is the command line run as the toolgate binary in dir, with
// exactly env as its environment (nothing of the test's).
func toolgateCmd(t *testing.T, dir string, env []string, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Dir = dir
	cmd.Env = append([]string{asMain + "=1", "PATH=" + os.Getenv("PATH"), "HOME=" + dir}, env...)
	return cmd
}

// agentToken is a token of the server's development key for an agent of
// tenant demo, granting tools.
func agentToken(t *testing.T, s server, jti string, ttl time.Duration, tools ...string) string {
	t.Helper()
	k, err := token.LoadSigningKey(filepath.Join(s.data, "dev-signing-key.jwk"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := token.Mint(k, token.Claims{
		ToolID: token.Patterns(tools), TenantID: "demo", AgentDID: node.DevAgent, AllowedOperations: []string{token.OperationExecute},
		RegisteredClaims: jwt.RegisteredClaims{Issuer: "toolgate", Audience: jwt.ClaimStrings{"toolgate"}, Subject: node.DevAgent,
			ID: jti, IssuedAt: jwt.NewNumericDate(time.Now()), ExpiresAt: jwt.NewNumericDate(time.Now().Add(ttl))},
	})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestMCPStdioAsAgent: `toolgate mcp --stdio` launched as a desktop client
// launches it (from a directory outside the repository, with only the
// agent's token in its environment) lists the tools the token grants and
// calls one; the registry is read through the tenant's own endpoints.
func TestMCPStdioAsAgent(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	tok := agentToken(t, s, "mcp-agent", time.Hour, "echo", "math.*")
	dir := t.TempDir()
	cmd := toolgateCmd(t, dir, []string{"TOOLGATE_TOKEN=" + tok}, "mcp", "--stdio", "--nats", s.url, "--log-level", "warn")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "desktop", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connecting: %v\n%s", err, stderr.String())
	}
	defer cs.Close()
	lr, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v\n%s", err, stderr.String())
	}
	var names []string
	for _, tl := range lr.Tools {
		names = append(names, tl.Name)
	}
	if !slices.Contains(names, "echo") || !slices.Contains(names, "math.eval") || slices.Contains(names, "fs.read_file") {
		t.Fatalf("tools/list shows %v; want echo and math.eval, not fs.read_file", names)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"message": "from an agent"}})
	if err != nil || res.IsError {
		t.Fatalf("tools/call echo: %v %+v\n%s", err, res, stderr.String())
	}
	if got := res.Content[0].(*mcp.TextContent).Text; !strings.Contains(got, "from an agent") {
		t.Fatalf("echo answered %q", got)
	}
}
