package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/mcpfront"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
)

// mcpCmd serves toolgate's tools to MCP clients (internal/mcpfront).
func (a *app) mcpCmd() *cobra.Command {
	var c mcpfront.Config
	var tokenFile, jwks, iss, aud, level string
	cmd := &cobra.Command{
		Use:   "mcp (--stdio | --listen HOST:PORT)",
		Short: "Serve toolgate's tools to MCP clients; every tools/call runs through the pipeline",
		Example: `  TOOLGATE_TOKEN=$(cat toolgate-data/dev-token) toolgate mcp --stdio
  TOOLGATE_TOKEN=$(cat toolgate-data/dev-token) toolgate mcp --listen 127.0.0.1:8765
  toolgate mcp --listen 127.0.0.1:8765 --creds mcp.creds   # serves every tenant`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if c.Stdio == (c.Listen != "") {
				return usageErr("mcp: give exactly one of --stdio and --listen")
			}
			c.NATSURL = a.conn.ServerURL()
			// The front door connects with service credentials only when
			// they are given (--creds, --nkey, NATS_CREDS, NATS_TOKEN);
			// otherwise as the agent whose token it serves, with that
			// agent's rights and nothing more. Credentials lying in a data
			// directory are never picked up: an MCP client launched there
			// would hold rights it never asked for.
			svc := a.conn
			svc.Token, svc.InboxPrefix, svc.LocalCreds = "", "", ""
			if svc.Creds != "" || svc.Nkey != "" || svc.NATSToken != "" {
				opts, err := svc.NATSOptions()
				if err != nil {
					return err
				}
				c.NATSOptions = append(opts, nats.Name("toolgate-mcp"))
				if svc.Creds != "" {
					// The registry it reads from the bucket honours only
					// what an operator of the same deployment signed.
					if c.StateProof, err = node.StateProofs(svc.Creds); err != nil {
						logger(a.stderr, level).Warn("not toolgate credentials: manifests are not checked for an operator's signature", "err", err)
					}
				}
			}
			c.Log = logger(a.stderr, level)
			c.Token = a.conn.Token // --token, else TOOLGATE_TOKEN
			if tokenFile != "" {
				b, err := os.ReadFile(tokenFile)
				if err != nil {
					return fmt.Errorf("token file: %w", err)
				}
				c.Token = strings.TrimSpace(string(b))
			}
			if !c.Stdio && len(c.NATSOptions) > 0 {
				c.Token = "" // each HTTP request brings its own
			}
			path := jwks
			if path == "" {
				if _, err := os.Stat(node.DevJWKSPath(a.data)); err == nil {
					path = node.DevJWKSPath(a.data)
				} else if !errors.Is(err, fs.ErrNotExist) {
					return err
				}
			}
			if path != "" {
				kf, err := token.OpenKeyFile(path, c.Log)
				if err != nil {
					return fmt.Errorf("key set: %w", err)
				}
				go kf.Watch(cmd.Context(), time.Second)
				c.Verifier = &token.Verifier{Keys: kf, Issuer: iss, Audience: aud, Leeway: node.TokenLeeway}
			} else if !c.Stdio {
				// No key set here: the one the deployment publishes on
				// the bus, kept current as it rotates.
				c.BusVerifier = &token.Verifier{Issuer: iss, Audience: aud, Leeway: node.TokenLeeway}
			}
			var err error
			before := true // refused before any session began
			if _, terr := api.ReadTokenClaims(c.Token); c.Stdio && c.Token != "" && terr != nil {
				// The one refusal of a token that is no JWT, as every
				// other command says it.
				err = malformedToken(terr, a.tokenSource(), terr)
			} else {
				err = mcpfront.Run(cmd.Context(), c)
				before = err != nil && (strings.HasPrefix(err.Error(), "connecting to ") || strings.HasPrefix(err.Error(), "capability token: "))
			}
			if len(c.NATSOptions) == 0 && c.Token != "" {
				a.conn.Token = c.Token // who was refused, for the explanation
			}
			err = a.explainRefusal(err)
			if c.Stdio && before && refusalCode(errorECode(err)) != 0 {
				// Refused before any session: the client is told over MCP.
				serveRefusal(cmd.Context(), a.stdin, a.stdout, err)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.BoolVar(&c.Stdio, "stdio", false, "serve one MCP session on stdin/stdout, with the token of TOOLGATE_TOKEN or --token-file")
	f.StringVar(&c.Listen, "listen", "", "serve streamable HTTP on HOST:PORT (path /mcp); each request carries Authorization: Bearer <capability token>")
	f.StringVar(&tokenFile, "token-file", "", "file holding the capability token of the stdio session, and who the front end connects as without --creds (default: --token, $TOOLGATE_TOKEN)")
	f.StringVar(&jwks, "jwks", "", "key set (JWKS file) tokens are verified with (default: the development key set in --data; else, over HTTP, the one the deployment publishes on the bus)")
	f.StringVar(&c.Tenant, "tenant", "", "refuse tokens of any other tenant")
	f.StringVar(&iss, "token-issuer", "toolgate", "required iss of capability tokens")
	f.StringVar(&aud, "token-audience", "toolgate", "required aud of capability tokens")
	f.DurationVar(&c.MaxWait, "max-wait", mcpfront.DefaultMaxWait, "longest a tools/call waits for its result, approval included")
	f.BoolVar(&c.WaitApproval, "wait-approval", false, "keep a tools/call that waits for a person's approval open until it ends (a client's request timeout then cancels it); default: answer it at once with its invocation id, and serve "+mcpfront.StatusTool+" for its outcome")
	f.DurationVar(&c.SessionTimeout, "session-timeout", mcpfront.DefaultSessionTimeout, "close HTTP sessions idle this long, cancelling their calls")
	f.StringVar(&level, "log-level", "info", "debug, info, warn or error (logs go to stderr)")
	return cmd
}

// errorECode is the E-code of err, "" for none.
func errorECode(err error) string {
	var te *api.Error
	if errors.As(err, &te) {
		return te.ECode
	}
	return ""
}
