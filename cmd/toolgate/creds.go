package main

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/connect"
	"github.com/toolgate/toolgate/subjects"
)

func (a *app) credsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "creds",
		Short: "Issue named bus credentials (approver, auditor, admin, operator, control, a stage) from the deployment's keys",
		Args:  subcommand,
	}
	cmd.AddCommand(a.credsIssueCmd(), a.credsTenantsCmd(), a.credsContextCmd(), a.credsRotateCmd())
	return cmd
}

func (a *app) credsTenantsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "tenants [TENANT...]",
		Short: "Declare the tenants whose agents external servers admit, and write auth.conf again",
		Long: `Declare the tenants whose agents external servers admit: each named tenant is
added to <data>/busauth/tenants, and <data>/busauth/auth.conf is written again
with one account per declared tenant. Copy auth.conf to the servers, reload
them (nats-server --signal reload) and restart the auth callout, which refuses
agents of undeclared tenants. With no tenant, it lists the declared ones. The
embedded server (serve without --nats) needs no declaration: it makes a
tenant's account when its first agent connects. See docs/security.md.`,
		Example: `  toolgate creds tenants acme globex`,
		RunE: func(cmd *cobra.Command, args []string) error {
			keys, err := busauth.LoadKeys(a.data)
			if err != nil {
				return fmt.Errorf("creds tenants: the deployment's keys (%s): %w", filepath.Join(a.data, busauth.DirName), err)
			}
			tenants, err := busauth.LoadTenants(a.data)
			if err != nil {
				return err
			}
			if len(args) > 0 {
				for _, t := range args {
					if err := subjects.CheckTenant(t); err != nil {
						return usageErr("creds tenants: %v", err)
					}
				}
				if err := busauth.WriteTenants(a.data, append(tenants, args...)); err != nil {
					return err
				}
				if tenants, err = busauth.LoadTenants(a.data); err != nil {
					return err
				}
				if err := busauth.WriteAuthConf(a.data, keys); err != nil {
					return err
				}
			}
			if a.json {
				return a.printJSON(map[string]any{"tenants": tenants,
					"auth_conf": filepath.Join(a.data, busauth.DirName, busauth.AuthConfFile)})
			}
			for _, t := range tenants {
				fmt.Fprintln(a.stdout, t)
			}
			return nil
		},
	}
}

func (a *app) credsIssueCmd() *cobra.Command {
	var (
		name, role, out string
		ttl             time.Duration
		force           bool
	)
	cmd := &cobra.Command{
		Use:   "issue",
		Short: "Write a .creds file (and its .jwt and .nk halves) for a named person, operator, control service or stage",
		Long: `Write a .creds file (and its .jwt and .nk halves) for a named person (approver:
decides approvals and reads the trail; auditor: reads the trail; admin:
policy, tools, models, hooks, sources, re-drive, shadow, breakers,
revocations), the operator (bootstrap and break-glass), the control service
or a stage (validate, authorize, route, execute, verify, audit), signed with
the credential signer in <data>/busauth (the deployment's keys: run it where
serve wrote them). Nothing is sent to the bus: it is admitted because its
signer is the deployment's. An approval decided with it records
<role>:<name>, e.g. approver:alice. Roles and the rights each command
needs: docs/security.md.`,
		Example: `  toolgate creds issue --role approver --name alice --ttl 720h --out alice.creds
  toolgate creds issue --role admin --name bob --ttl 24h
  export NATS_NKEY=alice.nk NATS_TOKEN="$(cat alice.jwt)"`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r := busauth.Role(role)
			if !r.Issued() {
				return usageErr("creds issue: --role must be approver, auditor, admin, operator, control or a stage (%s), not %q", stageRoleNames(), role)
			}
			if name == "" || strings.ContainsAny(name, ": \t\r\n") {
				return usageErr("creds issue: --name must be a name without spaces or colons, got %q", name)
			}
			if r.Person() && strings.ContainsAny(name, ".*>") {
				return usageErr("creds issue: a person's --name is one subject token (no '.', '*' or '>'), got %q", name)
			}
			if out == "" {
				out = name + ".creds"
			}
			if !strings.HasSuffix(out, ".creds") {
				return usageErr("creds issue: --out must end in .creds (the .jwt and .nk halves are written beside it), got %q", out)
			}
			base := strings.TrimSuffix(out, ".creds")
			if !force {
				for _, p := range []string{out, base + ".jwt", base + ".nk"} {
					if fileExists(p) {
						return fmt.Errorf("creds issue: %s exists (use --force to replace it)", p)
					}
				}
			}
			keys, err := busauth.LoadKeys(a.data)
			if err != nil {
				return fmt.Errorf("creds issue: the deployment's keys (%s): %w", filepath.Join(a.data, busauth.DirName), err)
			}
			b, err := keys.IssueCredentials(r, name, ttl)
			if err != nil {
				return err
			}
			if err := busauth.WriteCredsFiles(out, b); err != nil {
				return err
			}
			if a.json {
				return a.printJSON(map[string]any{"name": name, "role": role, "user": string(r) + ":" + name,
					"creds": out, "jwt": base + ".jwt", "nkey": base + ".nk", "ttl": ttl.String()})
			}
			expires := "never expires"
			if ttl > 0 {
				expires = "expires " + time.Now().Add(ttl).UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(a.stdout, "%s:%s credentials in %s (%s); toolgate and the nats CLI read them with\n\n  export NATS_NKEY=%s NATS_TOKEN=\"$(cat %s)\"\n",
				role, name, out, expires, base+".nk", base+".jwt")
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "who the credentials are for (recorded as <role>:<name>, e.g. on approvals)")
	cmd.Flags().StringVar(&role, "role", "operator", "approver, auditor, admin (people), operator (break-glass), control or a stage: "+stageRoleNames())
	cmd.Flags().StringVar(&out, "out", "", "credentials file to write (default <name>.creds; <name>.jwt and <name>.nk beside it)")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "lifetime (0: never expires)")
	cmd.Flags().BoolVar(&force, "force", false, "replace existing files")
	return cmd
}

func stageRoleNames() string {
	names := make([]string, len(busauth.StageRoles))
	for i, r := range busauth.StageRoles {
		names[i] = string(r)
	}
	return strings.Join(names, ", ")
}

// credsContextCmd writes a nats CLI context for the credentials the
// command connects with: the nats CLI's --creds cannot carry toolgate's
// (the server drops a CONNECT's JWT when it is not in operator mode), and
// `nats context save --token` stores no token in some versions.
func (a *app) credsContextCmd() *cobra.Command {
	var force bool
	var description string
	cmd := &cobra.Command{
		Use:   "context NAME",
		Short: "Write a nats CLI context for an operator's, a role's or an agent's credentials",
		Long: `Write the nats CLI context NAME ($XDG_CONFIG_HOME/nats/context/NAME.json,
default ~/.config) holding the server (--nats) and the credentials given:
toolgate-issued credentials (--creds FILE, or --nkey with NATS_TOKEN) as an
nkey with the JWT as the connect token, which is how toolgate's bus admits
them (nats --creds cannot: the server drops a CONNECT's JWT outside operator
mode); or an agent's capability token (--token, TOOLGATE_TOKEN) with the
agent's own inbox prefix. Then ` + "`nats --context NAME ...`" + ` and
` + "`toolgate --context NAME ...`" + ` connect as them, and toolgate signs with
operator credentials as it does given them directly. A credentials file's
nkey is written beside the context (NAME.nk).`,
		Example: `  toolgate creds context tg-operator --creds toolgate-data/busauth/operator.creds
  toolgate creds context tg-agent --token "$(cat toolgate-data/dev-token)"
  nats --context tg-agent req tool.svc.demo.tools.list '{}'`,
		Args: exactArgs(1, "the context's name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			o := a.conn
			c := connect.Context{Description: description, URL: o.ServerURL()}
			path, err := connect.ContextPath(name)
			if err != nil {
				return usageErr("creds context: %v", err)
			}
			if fileExists(path) && !force {
				return fmt.Errorf("creds context: %s exists (use --force to replace it)", path)
			}
			nkPath := strings.TrimSuffix(path, ".json") + ".nk"
			who := ""
			// An explicit --token wins over credentials the environment
			// names (a shell holding the operator's NATS_NKEY, say).
			tokenFirst := flagChanged(cmd, "token") && !flagChanged(cmd, "creds")
			switch {
			case o.Creds != "" && !tokenFirst:
				b, err := os.ReadFile(o.Creds)
				if err != nil {
					return fmt.Errorf("--creds: %w", err)
				}
				if !connect.IsToolgateCreds(b) {
					return usageErr("creds context: %s was not issued by toolgate; the nats CLI takes it as it is: nats --creds %s", o.Creds, o.Creds)
				}
				tok, seed, err := busauth.SplitCreds(b)
				if err != nil {
					return fmt.Errorf("--creds %s: %w", o.Creds, err)
				}
				if err := os.MkdirAll(filepath.Dir(nkPath), 0o700); err != nil {
					return err
				}
				if err := busauth.WriteSeed(nkPath, seed); err != nil {
					return err
				}
				c.NKey, c.Token, who = nkPath, tok, "the credentials of "+o.Creds
			case o.Nkey != "" && o.NATSToken != "" && !tokenFirst:
				abs, err := filepath.Abs(o.Nkey)
				if err != nil {
					return err
				}
				c.NKey, c.Token, who = abs, o.NATSToken, "the nkey "+o.Nkey+" and its JWT"
			case o.Token != "":
				claims, err := api.ReadTokenClaims(o.Token)
				if err != nil || claims.TenantID == "" || claims.ID == "" {
					return usageErr("creds context: the capability token names no tenant and token id (jti): %v", err)
				}
				c.Token, c.InboxPrefix = o.Token, cmp.Or(o.InboxPrefix, busauth.InboxPrefix(claims.TenantID, claims.ID))
				who = "the agent of tenant " + claims.TenantID + " (inbox prefix " + c.InboxPrefix + ")"
			default:
				return usageErr("creds context: give the credentials to store: --creds FILE, --nkey FILE with NATS_TOKEN, or --token (TOOLGATE_TOKEN)")
			}
			if _, err := connect.WriteContext(name, c); err != nil {
				return err
			}
			if a.json {
				return a.printJSON(map[string]any{"context": name, "path": path, "url": c.URL, "inbox_prefix": c.InboxPrefix})
			}
			fmt.Fprintf(a.stdout, "nats context %s (%s) connects to %s as %s:\n\n  nats --context %s ...\n  toolgate --context %s ...\n",
				name, path, c.URL, who, name, name)
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "replace an existing context")
	cmd.Flags().StringVar(&description, "description", "toolgate", "the context's description")
	return cmd
}

func flagChanged(cmd *cobra.Command, name string) bool {
	f := cmd.Flag(name)
	return f != nil && f.Changed
}
