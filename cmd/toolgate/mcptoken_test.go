package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"os"
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

// mcpListen starts `toolgate mcp --listen` on s from an empty directory
// with nothing but tok in TOOLGATE_TOKEN, and returns its address once it
// serves tok.
func mcpListen(t *testing.T, s server, tok string) (addr string, connect func(ctx context.Context, tok string) (*mcp.ClientSession, error), stderr *syncBuffer) {
	t.Helper()
	addr = freeAddr(t)
	cmd := toolgateCmd(t, t.TempDir(), []string{"TOOLGATE_TOKEN=" + tok}, "mcp", "--listen", addr, "--nats", s.url, "--log-level", "info")
	stderr = &syncBuffer{}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Signal(os.Interrupt); <-exited })
	connect = func(ctx context.Context, tok string) (*mcp.ClientSession, error) {
		return mcp.NewClient(&mcp.Implementation{Name: "http-agent", Version: "1"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", HTTPClient: &http.Client{Transport: bearer(tok)}}, nil)
	}
	waitFor(t, "the HTTP front end", func() bool {
		select {
		case <-exited:
			t.Fatalf("mcp --listen with only the token exited\n%s", stderr.String())
		default:
		}
		cs, err := connect(t.Context(), tok)
		if err == nil {
			cs.Close()
		}
		return err == nil
	})
	return addr, connect, stderr
}

// echoes calls echo through cs and fails unless it answers msg.
func echoes(t *testing.T, ctx context.Context, cs *mcp.ClientSession, msg string, log *syncBuffer) {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"message": msg}})
	if err != nil || res.IsError {
		t.Fatalf("tools/call echo: %v %+v\n%s", err, res, log.String())
	}
	if b, _ := json.Marshal(res.Content); !strings.Contains(string(b), msg) {
		t.Fatalf("echo answered %s, not %q", b, msg)
	}
}

// refusedAs posts an initialize with tok to the front end at addr and
// returns the E-code of its 401, failing on any other answer.
func refusedAs(t *testing.T, addr, tok string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+addr+"/mcp", strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		ECode string `json:"e_code"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("answered %d, want 401", resp.StatusCode)
	}
	return body.ECode
}

// TestMCPListenWithTokenOnly: outside any data directory, with nothing but
// the agent's token, `mcp --listen` starts and serves that token, and
// another of the same agent, verified with the key set the bus publishes;
// a token of a key the deployment does not hold is refused.
func TestMCPListenWithTokenOnly(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	tok := agentToken(t, s, "mcp-token-only", time.Hour, "echo")
	_, connect, stderr := mcpListen(t, s, tok)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cs, err := connect(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	lr, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v\n%s", err, stderr.String())
	}
	if !slices.ContainsFunc(lr.Tools, func(tl *mcp.Tool) bool { return tl.Name == "echo" }) {
		t.Fatalf("tools/list shows %d tools, not echo", len(lr.Tools))
	}
	echoes(t, ctx, cs, "token only", stderr)
	other, err := connect(ctx, agentToken(t, s, "mcp-token-other", time.Hour, "echo"))
	if err != nil {
		t.Fatalf("another token of the agent: %v\n%s", err, stderr.String())
	}
	echoes(t, ctx, other, "another token", stderr)
	other.Close()
	stranger, err := token.GenerateSigningKey(token.AlgEdDSA)
	if err != nil {
		t.Fatal(err)
	}
	if cs, err := connect(ctx, mintFor(t, stranger, node.DevAgent, "mcp-token-stranger", time.Hour, false, "echo")); err == nil {
		cs.Close()
		t.Fatal("a token of a key the deployment does not hold was served")
	}
}

// TestMCPListenKeysFromBus: a deployment with an operator's key set
// (serve --jwks); `mcp --listen` started from an empty directory with only
// a tenant reader's token in its environment serves a second agent's
// token, refuses a forged one (E3201) and an expired one (E3202), and
// serves a token of a key rotated into the key set after it started.
func TestMCPListenKeysFromBus(t *testing.T) {
	cleanEnv(t)
	dir := t.TempDir()
	jwks := filepath.Join(dir, "jwks.json")
	first, err := token.GenerateSigningKey(token.AlgEdDSA)
	if err != nil {
		t.Fatal(err)
	}
	writeJWKS(t, jwks, first)
	s := startToolgateWith(t, func(c *node.Config) { c.JWKSPath = jwks })
	front := mintFor(t, first, "did:agent:mcp-front", "mcp-front", time.Hour, true, "echo")
	addr, connect, stderr := mcpListen(t, s, front)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()

	second, err := connect(ctx, mintFor(t, first, "did:agent:second", "mcp-second", time.Hour, false, "echo"))
	if err != nil {
		t.Fatalf("a second agent's token: %v\n%s", err, stderr.String())
	}
	echoes(t, ctx, second, "second agent", stderr)
	second.Close()

	// Forged: the deployment's kid, another key's signature.
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	forger := &token.SigningKey{KID: first.KID, Alg: token.AlgEdDSA, Key: priv}
	if got := refusedAs(t, addr, mintFor(t, forger, "did:agent:second", "mcp-forged", time.Hour, false, "echo")); got != "E3201" {
		t.Fatalf("a forged token: %q, want E3201", got)
	}
	expired, err := token.Mint(first, token.Claims{
		ToolID: token.Patterns{"echo"}, TenantID: "demo", AgentDID: "did:agent:second", AllowedOperations: []string{token.OperationExecute},
		RegisteredClaims: jwt.RegisteredClaims{Issuer: "toolgate", Audience: jwt.ClaimStrings{"toolgate"}, Subject: "did:agent:second",
			ID: "mcp-expired", IssuedAt: jwt.NewNumericDate(time.Now().Add(-2 * time.Hour)), ExpiresAt: jwt.NewNumericDate(time.Now().Add(-time.Hour))},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := refusedAs(t, addr, expired); got != "E3202" {
		t.Fatalf("an expired token: %q, want E3202", got)
	}

	// Rotated in: serve reloads its key set file, and the front end
	// fetches the set again for the new kid.
	rotated, err := token.GenerateSigningKey(token.AlgEdDSA)
	if err != nil {
		t.Fatal(err)
	}
	writeJWKS(t, jwks, first, rotated)
	third := mintFor(t, rotated, "did:agent:third", "mcp-third", time.Hour, false, "echo")
	var cs *mcp.ClientSession
	waitFor(t, "a token of the rotated key to be served", func() bool {
		cs, err = connect(ctx, third)
		return err == nil
	})
	defer cs.Close()
	echoes(t, ctx, cs, "rotated key", stderr)
}

// writeJWKS writes the public key set of keys to path, atomically.
func writeJWKS(t *testing.T, path string, keys ...*token.SigningKey) {
	t.Helper()
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	for _, k := range keys {
		b, err := k.PublicJWKS()
		if err != nil {
			t.Fatal(err)
		}
		var one struct {
			Keys []json.RawMessage `json:"keys"`
		}
		if err := json.Unmarshal(b, &one); err != nil {
			t.Fatal(err)
		}
		set.Keys = append(set.Keys, one.Keys...)
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".new", b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}
