package mcptool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/sandbox"
)

// newClient is the MCP client toolgate connects with. It declares no
// capabilities: no roots (server-filesystem would replace its allowed
// directories with the client's roots), no sampling, no elicitation, so a
// server has no way to call back into toolgate.
func newClient() *mcp.Client {
	return mcp.NewClient(&mcp.Implementation{Name: "toolgate", Version: "1"},
		&mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}, ProgressNotificationHandler: onProgress})
}

// stdioDial starts the server of spec in the sandbox and connects over its
// stdin and stdout.
func stdioDial(cfg sandbox.Config, spec sandbox.Spec) dialFunc {
	return stdioDialWith(cfg, spec, newClient)
}

// stdioDialWith is stdioDial with the client mk makes.
func stdioDialWith(cfg sandbox.Config, spec sandbox.Spec, mk func() *mcp.Client) dialFunc {
	return func(ctx context.Context) (*conn, error) {
		p, err := sandbox.NewProcess(cfg, spec)
		if err != nil {
			return nil, err
		}
		inR, inW, err := os.Pipe()
		if err != nil {
			p.Kill()
			return nil, sandbox.StartErr(err)
		}
		outR, outW, err := os.Pipe()
		if err != nil {
			p.Kill()
			_, _ = inR.Close(), inW.Close()
			return nil, sandbox.StartErr(err)
		}
		stderr := &tail{max: 8 << 10}
		p.Cmd.Stdin, p.Cmd.Stdout, p.Cmd.Stderr = inR, outW, stderr
		// A grandchild holding stderr open must not keep Wait from returning.
		p.Cmd.WaitDelay = time.Second
		if err := p.Cmd.Start(); err != nil {
			p.Kill()
			_, _, _, _ = inR.Close(), inW.Close(), outR.Close(), outW.Close()
			return nil, sandbox.StartErr(err)
		}
		_, _ = inR.Close(), outW.Close() // the child's ends
		c := &conn{done: make(chan struct{})}
		exited := make(chan struct{})
		go func() {
			werr := p.Cmd.Wait()
			p.Kill() // whatever it left in its group
			c.why = exitReason(werr, p.Cmd.ProcessState, stderr.String())
			close(exited)
			_ = outR.Close()
			close(c.done)
		}()
		var once sync.Once
		c.stop = func() {
			once.Do(func() {
				if c.session != nil {
					// Closing stdin is the protocol's way to ask a stdio
					// server to end; it is killed if it does not.
					go func() { _ = c.session.Close() }()
				} else {
					_ = inW.Close()
				}
				p.Stop(exited, 2*time.Second)
				<-c.done
			})
		}
		session, err := mk().Connect(ctx, &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
		if err != nil {
			c.stop()
			return nil, api.WrapError(err, api.ExternalAPIError, api.EMCPServerDown,
				"the MCP handshake failed: %v%s", err, lastLines(stderr.String())).WithDetail("not_started", true)
		}
		c.session = session
		return c, nil
	}
}

// httpDial connects to a streamable-HTTP server at endpoint; connections go
// only to host:port, redirects included.
func httpDial(endpoint, host string, port int) dialFunc {
	return httpDialWith(endpoint, host, port, newClient, true)
}

// httpDialWith is httpDial with the client mk makes; noSSE drops the
// standalone stream a server's notifications arrive on.
func httpDialWith(endpoint, host string, port int, mk func() *mcp.Client, noSSE bool) dialFunc {
	return func(ctx context.Context) (*conn, error) {
		client := pinnedClient(host, port)
		t := &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: client, DisableStandaloneSSE: noSSE}
		session, err := mk().Connect(ctx, t, nil)
		if err != nil {
			client.CloseIdleConnections()
			return nil, api.WrapError(err, api.ExternalAPIError, api.EMCPServerDown,
				"connecting to the MCP server at %s: %v", endpoint, err).WithDetail("not_started", true)
		}
		c := &conn{session: session, done: make(chan struct{})}
		go func() {
			werr := session.Wait()
			c.why = fmt.Errorf("the connection ended: %v", werr)
			close(c.done)
		}()
		var once sync.Once
		c.stop = func() {
			once.Do(func() {
				_ = session.Close()
				<-c.done
				client.CloseIdleConnections()
			})
		}
		return c, nil
	}
}

// pinnedClient is an HTTP client that dials only host:port, whatever a
// redirect or a later request names.
func pinnedClient(host string, port int) *http.Client {
	want := net.JoinHostPort(host, fmt.Sprint(port))
	d := &net.Dialer{Timeout: 10 * time.Second}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // a proxy would be a host the manifest does not name
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if !strings.EqualFold(addr, want) {
			return nil, fmt.Errorf("%s is not the MCP server's host %s", addr, want)
		}
		return d.DialContext(ctx, network, addr)
	}
	return &http.Client{Transport: tr, CheckRedirect: func(req *http.Request, _ []*http.Request) error {
		return errors.New("the MCP server redirected; redirects are not followed")
	}}
}

func exitReason(werr error, st *os.ProcessState, stderr string) error {
	tailMsg := lastLines(stderr)
	if st == nil {
		return fmt.Errorf("it could not be waited for: %v%s", werr, tailMsg)
	}
	return fmt.Errorf("it ended with %s%s", st.String(), tailMsg)
}

// lastLines is the end of a server's stderr, for error messages.
func lastLines(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	lines := strings.Split(s, "\n")
	lines = lines[max(0, len(lines)-3):]
	out := strings.Join(lines, " | ")
	if len(out) > 500 {
		out = out[len(out)-500:]
	}
	return ": " + out
}

// tail keeps the last max bytes written to it.
type tail struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if over := t.buf.Len() - t.max; over > 0 {
		t.buf.Next(over)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}
