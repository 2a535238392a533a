package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/internal/mcpfront"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
)

// mcpCmd serves toolgate's tools to MCP clients (internal/mcpfront).
func mcpCmd(ctx context.Context, args []string) error {
	fset := flag.NewFlagSet("mcp", flag.ContinueOnError)
	var c mcpfront.Config
	fset.BoolVar(&c.Stdio, "stdio", false, "serve one MCP session on stdin/stdout, with the token of TOOLGATE_TOKEN or --token-file")
	fset.StringVar(&c.Listen, "listen", "", "serve streamable HTTP on HOST:PORT (path /mcp); each request carries Authorization: Bearer <capability token>")
	fset.StringVar(&c.NATSURL, "nats", natsURL(), "NATS server URL (default: $NATS_URL, else "+nats.DefaultURL+")")
	tokenFile := fset.String("token-file", "", "file holding the capability token of the stdio session (default: $TOOLGATE_TOKEN)")
	jwks := fset.String("jwks", "", "key set (JWKS file) tokens are verified with")
	data := fset.String("data", "toolgate-data", "data directory of 'toolgate serve --examples': its development key set is used when --jwks is not given")
	fset.StringVar(&c.Tenant, "tenant", "", "refuse tokens of any other tenant")
	iss := fset.String("token-issuer", "toolgate", "required iss of capability tokens")
	aud := fset.String("token-audience", "toolgate", "required aud of capability tokens")
	fset.DurationVar(&c.MaxWait, "max-wait", mcpfront.DefaultMaxWait, "longest a tools/call waits for its result, approval included")
	fset.DurationVar(&c.SessionTimeout, "session-timeout", mcpfront.DefaultSessionTimeout, "close HTTP sessions idle this long, cancelling their calls")
	level := fset.String("log-level", "info", "debug, info, warn or error (logs go to stderr)")
	if err := fset.Parse(args); err != nil {
		return err
	}
	c.Log = logger(*level)
	if c.Stdio {
		c.Token = strings.TrimSpace(os.Getenv("TOOLGATE_TOKEN"))
		if *tokenFile != "" {
			b, err := os.ReadFile(*tokenFile)
			if err != nil {
				return fmt.Errorf("token file: %w", err)
			}
			c.Token = strings.TrimSpace(string(b))
		}
	}
	path := *jwks
	if path == "" {
		if _, err := os.Stat(node.DevJWKSPath(*data)); err == nil {
			path = node.DevJWKSPath(*data)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if path != "" {
		kf, err := token.OpenKeyFile(path, c.Log)
		if err != nil {
			return fmt.Errorf("key set: %w", err)
		}
		go kf.Watch(ctx, time.Second)
		c.Verifier = &token.Verifier{Keys: kf, Issuer: *iss, Audience: *aud, Leeway: 30 * time.Second}
	}
	return mcpfront.Run(ctx, c)
}
