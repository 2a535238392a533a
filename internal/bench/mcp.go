package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages/execute/mcptool"
)

const mcpSamples = 300

// MCPServersDir is where `make mcp-servers` installs the reference servers:
// $TOOLGATE_MCP_SERVERS, or .cache/mcp-servers under the working directory.
func MCPServersDir() string {
	return cmp.Or(os.Getenv("TOOLGATE_MCP_SERVERS"), filepath.Join(".cache", "mcp-servers"))
}

// MeasureMCP times one call of server-everything's echo tool, the server
// warm, three ways: with the MCP Go SDK directly (no sandbox: the floor),
// through the mcp executor with no sandbox (what supervision, the
// concurrency limit and result conversion add), and through the mcp
// executor in the bubblewrap sandbox (what a deployment runs). Each is
// sequential calls, so the figures are per-call latency, not throughput.
func MeasureMCP(ctx context.Context, serversDir string) ([]Cost, error) {
	modules, err := filepath.Abs(filepath.Join(serversDir, "node_modules"))
	if err != nil {
		return nil, err
	}
	script := filepath.Join(modules, "@modelcontextprotocol", "server-everything", "dist", "index.js")
	if _, err := os.Stat(script); err != nil {
		return nil, fmt.Errorf("server-everything is not installed (make mcp-servers): %w", err)
	}
	params := json.RawMessage(`{"message":"bench"}`)
	var out []Cost

	// The floor: the SDK speaking to the server over stdio.
	session, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).
		Connect(ctx, &mcp.CommandTransport{Command: exec.Command("node", script, "stdio")}, nil)
	if err != nil {
		return nil, fmt.Errorf("starting server-everything: %w", err)
	}
	direct, err := sample(ctx, func(ctx context.Context) error {
		_, err := session.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: params})
		return err
	})
	_ = session.Close()
	if err != nil {
		return nil, err
	}
	out = append(out, Cost{Name: "MCP SDK direct (stdio)", Samples: direct})

	spec, err := json.Marshal(mcptool.Spec{Server: "everything", Tool: "echo", Command: []string{"node", script, "stdio"},
		ReadOnlyPaths: []string{modules}})
	if err != nil {
		return nil, err
	}
	m, err := tools.Parse(fmt.Appendf(nil, `{"id":"mcp:everything:echo","name":"echo","version":"1.0.0","description":"echo",
		"kind":"mcp","mcp":%s,"input_schema":{"type":"object"}}`, spec))
	if err != nil {
		return nil, err
	}
	modes := []struct{ name, mode string }{{"mcp executor, no sandbox", sandbox.ModeNone}}
	if sandbox.Available() == nil {
		modes = append(modes, struct{ name, mode string }{"mcp executor, bwrap", sandbox.ModeBwrap})
	}
	for _, md := range modes {
		k := mcptool.New(mcptool.Config{Sandbox: sandbox.Config{Mode: md.mode, ReadOnlyRoots: []string{modules}}})
		fn, err := k.Prepare(m, &envelope.Invocation{Tenant: "bench"})
		if err != nil {
			_ = k.Close()
			return nil, err
		}
		s, err := sample(ctx, func(ctx context.Context) error {
			_, err := fn(ctx, params)
			return err
		})
		_ = k.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", md.name, err)
		}
		out = append(out, Cost{Name: md.name, Samples: s})
	}
	return out, nil
}

// sample runs call mcpSamples times after a warm-up (the first call starts
// the server) and returns the sorted durations.
func sample(ctx context.Context, call func(context.Context) error) ([]time.Duration, error) {
	for range 20 {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := call(cctx)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	out := make([]time.Duration, 0, mcpSamples)
	for range mcpSamples {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		start := time.Now()
		err := call(cctx)
		d := time.Since(start)
		cancel()
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	slices.Sort(out)
	return out, nil
}

// PrintMCP writes MeasureMCP's figures with each row's ratio to the first.
func PrintMCP(w io.Writer, costs []Cost) {
	if len(costs) == 0 {
		return
	}
	fmt.Fprintf(w, "\nMCP call, server-everything echo, warm, %d sequential calls\n", mcpSamples)
	fmt.Fprintf(w, "%-30s %10s %10s %10s %10s\n", "path", "p50", "p99", "p50 ratio", "p99 ratio")
	base := costs[0]
	for _, c := range costs {
		fmt.Fprintf(w, "%-30s %10s %10s %10.2f %10.2f\n", c.Name, us(c.quantile(0.5)), us(c.quantile(0.99)),
			float64(c.quantile(0.5))/float64(max(base.quantile(0.5), 1)),
			float64(c.quantile(0.99))/float64(max(base.quantile(0.99), 1)))
	}
}
