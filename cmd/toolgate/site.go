package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

func (a *app) siteCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "site",
		Short: "Declare the sites where tools run away from the hub, and see their links (docs/sites.md)",
		Args:  subcommand,
	}
	cmd.AddCommand(a.siteAddCmd(), a.siteListCmd())
	return cmd
}

func (a *app) siteAddCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "add NAME",
		Short: "Declare a site and write its bundle: credentials for its leaf node, its own signing key and the public keys its worker needs",
		Long: `Declare site NAME in <data>/busauth/sites and write its bundle to --out
(default NAME-site): busauth/site.creds, the credentials the site's leaf node
authenticates to the hub with (the hub grants them execute's work on NAME's
consumers only), the site's own signing key (its public half is added to
<data>/busauth/hops.pub as execute@NAME; declaring NAME again replaces it)
and the public keys its worker needs. No account, issuer or stage key leaves
the hub. Run it where serve wrote the
deployment's keys; with the hub reachable (operator credentials), NAME's
consumers are made at once, else when serve next starts. Copy the bundle to
the site and run there:

  toolgate serve --site NAME --hub nats-leaf://HUB:7422 --data BUNDLE`,
		Example: `  toolgate site add lab-eu --out lab-eu-site`,
		Args:    exactArgs(1, "the site's name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			site := args[0]
			if err := subjects.CheckSite(site); err != nil {
				return usageErr("site add: %v", err)
			}
			if out == "" {
				out = site + "-site"
			}
			creds, err := busauth.WriteSiteBundle(a.data, site, out)
			if err != nil {
				return fmt.Errorf("site add: %w", err)
			}
			made := a.ensureSite(cmd.Context(), site) == nil
			if a.json {
				return a.printJSON(map[string]any{"site": site, "bundle": out, "creds": creds, "consumers": made})
			}
			fmt.Fprintf(a.stdout, "site %s declared; its bundle is %s (credentials %s)\n", site, out, creds)
			if !made {
				fmt.Fprintln(a.stdout, "the hub was not reached: its consumers are made when serve next starts")
			}
			fmt.Fprintf(a.stdout, "at the site:\n\n  toolgate serve --site %s --hub nats-leaf://HUB:7422 --data %s\n", site, out)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "directory to write the site's bundle to (default NAME-site)")
	return cmd
}

// ensureSite makes site's consumers on the hub, when the command can reach
// it with credentials that may.
func (a *app) ensureSite(ctx context.Context, site string) error {
	if a.conn.Creds == "" && a.conn.Nkey == "" {
		if p := filepath.Join(a.data, busauth.DirName, busauth.OperatorCredsFile); fileExists(p) {
			a.conn.Creds = p
		}
	}
	js, done, err := a.jetStream()
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return topology.EnsureSites(ctx, js, topology.TopologyOptions{}, []string{site})
}

func (a *app) siteListCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the declared sites: link state, workers, queue depth and last contact",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sites, err := busauth.LoadSites(a.data)
			if err != nil {
				return err
			}
			if a.conn.Creds == "" && a.conn.Nkey == "" {
				if p := filepath.Join(a.data, busauth.DirName, busauth.OperatorCredsFile); fileExists(p) {
					a.conn.Creds = p
				}
			}
			js, done, err := a.jetStream()
			if err != nil {
				return &codeError{code: exitConnect, err: fmt.Errorf("site list: %w", err)}
			}
			defer done()
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			rows := make([]node.SiteState, 0, len(sites))
			for _, site := range sites {
				st, err := node.SiteStatus(ctx, js, site)
				if err != nil {
					return fmt.Errorf("site list: %s: %w", site, err)
				}
				rows = append(rows, st)
			}
			if a.json {
				return a.printJSON(map[string]any{"sites": rows})
			}
			fmt.Fprintf(a.stdout, "%-20s %-5s %7s %7s %7s  %s\n", "SITE", "LINK", "WORKERS", "QUEUED", "RUNNING", "LAST CONTACT")
			for _, r := range rows {
				last := "never"
				if r.LastContact != nil {
					last = r.LastContact.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(a.stdout, "%-20s %-5s %7d %7d %7d  %s\n", r.Site, r.Link, r.Workers, r.Queued, r.Running, last)
			}
			return nil
		},
	}
}
