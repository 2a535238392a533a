package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/internal/console"
)

func (a *app) consoleCmd() *cobra.Command {
	var listen, certFile, keyFile, by string
	var tenants []string
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the web console: approvals inbox, one invocation's timeline, live audit, overview",
		Long: `Serve the web console for the people who approve and watch. It connects with
operator credentials and signs every decision with them, exactly as
'toolgate approve' does. Signing in takes the one-time login link it prints
(the next link is printed when one is used); the session lives in an
HttpOnly, SameSite=Strict cookie. It listens on loopback unless told
otherwise, and a non-loopback --listen needs --tls-cert and --tls-key.
See docs/console.md.`,
		Example: `  toolgate console --data toolgate-data
  toolgate console --creds ops.creds --nats nats://nats:4222 --listen 0.0.0.0:8443 --tls-cert c.pem --tls-key k.pem`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tls := certFile != "" || keyFile != ""
			if tls && (certFile == "" || keyFile == "") {
				return usageErr("--tls-cert and --tls-key go together")
			}
			if !tls && !console.Loopback(listen) {
				return usageErr("--listen %s is not a loopback address: serving the console beyond this machine needs --tls-cert and --tls-key", listen)
			}
			if a.conn.Tenant != "" {
				tenants = append(tenants, a.conn.Tenant)
			}
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			scheme := map[bool]string{true: "https", false: "http"}[tls]
			base := scheme + "://" + ln.Addr().String()
			srv, err := console.New(console.Config{Client: c, Sign: c.Sign, By: or(by, whoami()), Tenants: tenants,
				OnLink: func(path string) { fmt.Fprintf(a.stdout, "sign in (the link works once): %s%s\n", base, path) }})
			if err != nil {
				_ = ln.Close()
				return err
			}
			fmt.Fprintf(a.stderr, "toolgate console on %s\n", base)
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
			errc := make(chan error, 2)
			go func() { errc <- srv.Run(ctx) }()
			go func() {
				if tls {
					errc <- hs.ServeTLS(ln, certFile, keyFile)
				} else {
					errc <- hs.Serve(ln)
				}
			}()
			select {
			case <-ctx.Done():
			case err = <-errc:
			}
			cancel()
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer scancel()
			_ = hs.Shutdown(sctx)
			if err != nil && !errors.Is(err, http.ErrServerClosed) && ctx.Err() == nil {
				return err
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:8080", "address to serve on (a non-loopback one needs --tls-cert and --tls-key)")
	f.StringVar(&certFile, "tls-cert", "", "TLS certificate (PEM) to serve HTTPS with")
	f.StringVar(&keyFile, "tls-key", "", "TLS private key (PEM) of --tls-cert")
	f.StringSliceVar(&tenants, "tenants", nil, "tenants whose approvals the inbox lists besides those the audit trail names (--tenant counts too)")
	f.StringVar(&by, "by", "", "who decides, for the record on a bus without authentication (default: user@host; an authenticated bus records the signing operator)")
	return cmd
}
