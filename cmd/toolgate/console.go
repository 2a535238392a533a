package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/console"
)

// consoleOptions are the console's flags, shared by console and serve
// --console.
type consoleOptions struct {
	listen, certFile, keyFile, by string
	tenants, allowHosts           []string
	// allowAdmin lets the console run with admin or operator credentials.
	allowAdmin bool
}

// consoleCredentials checks the credentials the console signs with: a
// person's, an approver's to decide (an auditor's console only watches).
// Admin and operator credentials reach far beyond approvals, and a
// browser session would hold them: refused (E3247) unless allowAdmin. No
// signer (a bus without authentication) is let through.
func consoleCredentials(signer *busauth.Signer, allowAdmin bool) error {
	if signer == nil {
		return nil
	}
	role, name := busauth.SignerRole(signer)
	switch {
	case role == busauth.RoleApprover || role == busauth.RoleAuditor:
		return nil
	case (role == busauth.RoleAdmin || role == busauth.RoleOperator) && allowAdmin:
		return nil
	case role == busauth.RoleAdmin || role == busauth.RoleOperator:
		return api.NewError(api.PermissionDenied, api.EConsoleCredentials,
			"the console runs with an approver's credentials (toolgate creds issue --role approver --name NAME), not %s:%s's; --allow-admin runs it with these", role, name)
	}
	return api.NewError(api.PermissionDenied, api.EConsoleCredentials,
		"the console runs with an approver's credentials (toolgate creds issue --role approver --name NAME), not %s:%s's", role, name)
}

// tlsFlags registers how browsers reach the console: TLS and its names.
func (o *consoleOptions) tlsFlags(fs *pflag.FlagSet, prefix string) {
	fs.StringVar(&o.certFile, prefix+"tls-cert", "", "TLS certificate (PEM) the console serves HTTPS with")
	fs.StringVar(&o.keyFile, prefix+"tls-key", "", "TLS private key (PEM) of the console's certificate")
	fs.StringSliceVar(&o.allowHosts, prefix+"allow-host", nil,
		"a name (host or host:port) the console answers to besides its listen address; requests naming another Host are refused")
}

// check refuses a console reachable beyond this machine without TLS.
func (o *consoleOptions) check(flag, prefix string) error {
	tls := o.certFile != "" || o.keyFile != ""
	if tls && (o.certFile == "" || o.keyFile == "") {
		return usageErr("--%stls-cert and --%stls-key go together", prefix, prefix)
	}
	if !tls && !console.Loopback(o.listen) {
		return usageErr("%s %s is not a loopback address: serving the console beyond this machine needs --%stls-cert and --%stls-key", flag, o.listen, prefix, prefix)
	}
	if console.Unspecified(o.listen) && len(o.allowHosts) == 0 {
		return usageErr("%s %s names no host a browser opens: give the console's name with --%sallow-host", flag, o.listen, prefix)
	}
	return nil
}

// runConsole serves the console over c until ctx ends.
func (a *app) runConsole(ctx context.Context, c *client.Client, o consoleOptions) error {
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	tls := o.certFile != ""
	base := map[bool]string{true: "https", false: "http"}[tls] + "://" + console.LinkHost(ln.Addr().String(), o.allowHosts)
	srv, err := console.New(console.Config{Client: c, Sign: c.Sign, By: or(o.by, whoami()), Tenants: o.tenants, AllowHosts: o.allowHosts,
		OnLink: func(path string) { fmt.Fprintf(a.stdout, "console: sign in (the link works once): %s%s\n", base, path) }})
	if err != nil {
		_ = ln.Close()
		return err
	}
	fmt.Fprintf(a.stderr, "toolgate console on %s\n", base)
	return srv.Serve(ctx, ln, o.certFile, o.keyFile)
}

// consoleCredsFile is the local console's approver credentials in
// <data>/busauth.
const consoleCredsFile = "approver-local.creds"

// serveConsole runs the console of serve --console once the pipeline is
// up at url, as approver:local (issued from the data directory's keys)
// unless the connection flags name other credentials.
func (a *app) serveConsole(ctx context.Context, url string, o consoleOptions) error {
	conn := a.conn
	conn.URL, conn.Context = url, ""
	if keys, err := busauth.LoadKeys(a.data); err == nil {
		// The local console is an approver's, approver:local, issued
		// here from the deployment's keys.
		p := filepath.Join(a.data, busauth.DirName, consoleCredsFile)
		b, err := keys.IssueCredentials(busauth.RoleApprover, "local", 0)
		if err == nil {
			err = busauth.WriteCredsFiles(p, b)
		}
		if err != nil {
			return err
		}
		conn.LocalCreds = p
	}
	signer, err := conn.Signer()
	if err != nil {
		return err
	}
	if err := consoleCredentials(signer, o.allowAdmin); err != nil {
		return err
	}
	nc, err := conn.Connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		return err
	}
	if signer != nil {
		c.Sign = func(subject string, body []byte) (nats.Header, error) {
			return signer.Sign(nil, subject, body, time.Now())
		}
	}
	return a.runConsole(ctx, c, o)
}

func (a *app) consoleCmd() *cobra.Command {
	var o consoleOptions
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the web console: approvals inbox, one invocation's timeline, live audit, overview",
		Long: `Serve the web console for the people who approve and watch. It connects with
an approver's credentials (toolgate creds issue --role approver --name NAME;
an auditor's only watch) and signs every decision with them, exactly as
'toolgate approve' does; it refuses admin and operator credentials unless
--allow-admin. Signing in takes the one-time login link it prints
(the next link is printed when one is used); the session lives in an
HttpOnly, SameSite=Strict cookie. It listens on loopback unless told
otherwise, and a non-loopback --listen needs --tls-cert and --tls-key.
See docs/console.md.`,
		Example: `  toolgate creds issue --role approver --name alice --out alice.creds && toolgate console --creds alice.creds
  toolgate console --creds alice.creds --nats nats://nats:4222 --listen 0.0.0.0:8443 --allow-host console.example.com --tls-cert c.pem --tls-key k.pem`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check("--listen", ""); err != nil {
				return err
			}
			if a.conn.Tenant != "" {
				o.tenants = append(o.tenants, a.conn.Tenant)
			}
			signer, err := a.conn.Signer()
			if err != nil {
				return err
			}
			if err := consoleCredentials(signer, o.allowAdmin); err != nil {
				return err
			}
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			return a.runConsole(cmd.Context(), c, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address to serve on (a non-loopback one needs --tls-cert and --tls-key)")
	o.tlsFlags(f, "")
	f.StringSliceVar(&o.tenants, "tenants", nil, "tenants whose approvals the inbox lists besides those the audit trail names (--tenant counts too)")
	f.BoolVar(&o.allowAdmin, "allow-admin", false, "run with admin or operator credentials (refused otherwise: the console is an approver's)")
	f.StringVar(&o.by, "by", "", "who decides, for the record on a bus without authentication (default: user@host; an authenticated bus records the signing operator)")
	return cmd
}
