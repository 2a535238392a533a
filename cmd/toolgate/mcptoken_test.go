package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMCPListenWithTokenOnly: outside any data directory, with nothing but
// the agent's token, `mcp --listen` starts and serves that token; another
// token, which it has no key set to verify, is refused.
func TestMCPListenWithTokenOnly(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	tok := agentToken(t, s, "mcp-token-only", time.Hour, "echo")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := toolgateCmd(t, t.TempDir(), []string{"TOOLGATE_TOKEN=" + tok}, "mcp", "--listen", addr, "--nats", s.url, "--log-level", "warn")
	var stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Signal(os.Interrupt); <-exited })
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	connect := func(tok string) (*mcp.ClientSession, error) {
		return mcp.NewClient(&mcp.Implementation{Name: "http-agent", Version: "1"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", HTTPClient: &http.Client{Transport: bearer(tok)}}, nil)
	}
	var cs *mcp.ClientSession
	waitFor(t, "the HTTP front end", func() bool {
		select {
		case <-exited:
			t.Fatalf("mcp --listen with only the token exited\n%s", stderr.String())
		default:
		}
		cs, err = connect(tok)
		return err == nil
	})
	defer cs.Close()
	lr, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v\n%s", err, stderr.String())
	}
	if !slices.ContainsFunc(lr.Tools, func(tl *mcp.Tool) bool { return tl.Name == "echo" }) {
		t.Fatalf("tools/list shows %d tools, not echo", len(lr.Tools))
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"message": "token only"}})
	if err != nil || res.IsError {
		t.Fatalf("tools/call echo: %v %+v\n%s", err, res, stderr.String())
	}
	if other, err := connect(agentToken(t, s, "mcp-token-other", time.Hour, "echo")); err == nil {
		other.Close()
		t.Fatal("a token the front end cannot verify was served")
	}
}
