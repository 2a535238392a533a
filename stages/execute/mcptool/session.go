package mcptool

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/internal/sandbox"
)

// Session is one live connection to an MCP server, for users other than
// the mcp kind (document sources): started and confined exactly as the
// kind's servers are, with the caller's notification handlers.
type Session struct{ c *conn }

// Client is the SDK session.
func (s *Session) Client() *mcp.ClientSession { return s.c.session }

// Done is closed when the server is gone; Why then says how.
func (s *Session) Done() <-chan struct{} { return s.c.done }

// Why says how the server went away, once Done is closed.
func (s *Session) Why() error { return s.c.why }

// Close ends the connection (and the server process of a stdio session).
func (s *Session) Close() { s.c.stop() }

// sessionClient is newClient with the caller's notification handlers: it
// still declares no capabilities, so the server cannot call back.
func sessionClient(h Handlers) func() *mcp.Client {
	return func() *mcp.Client {
		return mcp.NewClient(&mcp.Implementation{Name: "toolgate", Version: "1"},
			&mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}, ResourceUpdatedHandler: h.ResourceUpdated})
	}
}

// Handlers are the server notifications a Session's owner hears.
type Handlers struct {
	ResourceUpdated func(context.Context, *mcp.ResourceUpdatedNotificationRequest)
}

// DialStdio starts spec in the sandbox of cfg and connects over its
// stdin and stdout.
func DialStdio(ctx context.Context, cfg sandbox.Config, spec sandbox.Spec, h Handlers) (*Session, error) {
	c, err := stdioDialWith(cfg, spec, sessionClient(h))(ctx)
	if err != nil {
		return nil, err
	}
	return &Session{c}, nil
}

// DialHTTP connects to the streamable-HTTP server at url, keeping the
// stream its notifications arrive on; connections go to its host and
// port only.
func DialHTTP(ctx context.Context, url string, h Handlers) (*Session, error) {
	host, port, err := endpoint(url)
	if err != nil {
		return nil, err
	}
	c, err := httpDialWith(url, host, port, sessionClient(h), false)(ctx)
	if err != nil {
		return nil, err
	}
	return &Session{c}, nil
}

// CheckURL checks a streamable-HTTP server's URL as manifests' are.
func CheckURL(url string) error {
	_, _, err := endpoint(url)
	return err
}

// CheckReadOnlyPath checks a stdio server's read-only path as manifests' are.
func CheckReadOnlyPath(p string) error { return checkReadOnlyPath(p) }
