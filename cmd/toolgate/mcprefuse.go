package main

import (
	"context"
	"io"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpRefused is the JSON-RPC error code of requests an MCP session answers
// when toolgate refused its credentials before serving: in the range
// JSON-RPC leaves to servers.
const mcpRefused = -32001

// serveRefusal answers an MCP client over in and out, until it closes, with
// refusal for every request but the handshake: the client shows the same
// E-code and message the command line prints, instead of a connection that
// closed without a word.
func serveRefusal(ctx context.Context, in io.Reader, out io.Writer, refusal error) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "toolgate"}, nil)
	srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			switch method {
			case "initialize", "notifications/initialized", "ping":
				return next(ctx, method, req)
			}
			return nil, &jsonrpc.Error{Code: mcpRefused, Message: "toolgate: " + refusal.Error()}
		}
	})
	_ = srv.Run(ctx, &mcp.IOTransport{Reader: io.NopCloser(in), Writer: nopWriteCloser{out}})
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
