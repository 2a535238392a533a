package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/subjects"
)

func (a *app) siteCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "site",
		Short: "Declare the sites where tools run away from the hub, and see their links (docs/sites.md)",
		Args:  subcommand,
	}
	cmd.AddCommand(a.siteAddCmd(), a.siteRemoveCmd(), a.siteListCmd())
	return cmd
}

func (a *app) siteAddCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "add NAME",
		Short: "Declare a site at the hub and write its bundle: credentials for its leaf node, its own signing key and the public keys its worker needs",
		Long: `Declare site NAME at the running hub, by a request to its control service
signed with operator credentials (audited as admin.site.added), and write
the site's bundle to --out (default NAME-site). The site's private keys are
made here and only their public halves are sent: the hub records the user
of the site's credentials and the site's public signing key (execute@NAME in
its hops.pub), makes NAME's consumers, and answers the user JWT of the
credentials and the public keys the worker needs. The bundle holds
busauth/site.creds (the hub grants them execute's work on NAME's consumers
only, on its leaf-node port only), the site's signing key, hops.pub and
seal.pub; no account, issuer or stage key leaves the hub. Declaring NAME
again gives it new keys: its earlier bundle is refused from then on and its
open links are cut. Copy the bundle to the site and run there:

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
			keys, err := busauth.NewSiteKeys()
			if err != nil {
				return err
			}
			c, done, err := a.siteAdminClient()
			if err != nil {
				return err
			}
			defer done()
			added, err := c.AddSite(cmd.Context(), api.SiteRequest{Site: site, UserKey: keys.User(), SigningKey: keys.Signing(), By: whoami()})
			if err != nil {
				return fmt.Errorf("site add: %w", err)
			}
			files := map[string][]byte{}
			for name, b := range added.Files {
				files[name] = []byte(b)
			}
			creds, err := busauth.WriteSiteBundle(out, site, keys, added.JWT, files)
			if err != nil {
				return fmt.Errorf("site add: %s is declared at the hub, but its bundle was not written (run site add again): %w", site, err)
			}
			if a.json {
				return a.printJSON(map[string]any{"site": site, "bundle": out, "creds": creds, "consumers": added.Consumers})
			}
			fmt.Fprintf(a.stdout, "site %s declared; its bundle is %s (credentials %s)\n", site, out, creds)
			fmt.Fprintf(a.stdout, "at the site:\n\n  toolgate serve --site %s --hub nats-leaf://HUB:7422 --data %s\n", site, out)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "directory to write the site's bundle to (default NAME-site)")
	return cmd
}

func (a *app) siteRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "remove NAME",
		Short: "Remove a site: its credentials are refused from then on and its open leaf links cut",
		Long: `Remove site NAME at the running hub, by a request to its control service
signed with operator credentials (audited as admin.site.removed). The hub
forgets the site's credentials and signing key and cuts its open leaf links;
its credentials are refused when they dial again. A call for one of its
tools ends at route with E3273 from then on; the calls already waiting for
it stay in the pipeline (docs/sites.md).`,
		Example: `  toolgate site remove lab-eu`,
		Args:    exactArgs(1, "the site's name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, done, err := a.siteAdminClient()
			if err != nil {
				return err
			}
			defer done()
			r, err := c.RemoveSite(cmd.Context(), args[0], whoami())
			if err != nil {
				return fmt.Errorf("site remove: %w", err)
			}
			if a.json {
				return a.printJSON(r)
			}
			fmt.Fprintf(a.stdout, "site %s removed; %d of its links cut\n", r.Site, r.LinksCut)
			return nil
		},
	}
}

// siteAdminClient is adminClient with the data directory's operator
// credentials unless others are given.
func (a *app) siteAdminClient() (*client.Client, func(), error) {
	a.operatorCreds()
	return a.adminClient()
}

// operatorCreds has the command connect with the data directory's operator
// credentials unless others are given.
func (a *app) operatorCreds() {
	if a.conn.Creds == "" && a.conn.Nkey == "" {
		if p := filepath.Join(a.data, busauth.DirName, busauth.OperatorCredsFile); fileExists(p) {
			a.conn.Creds = p
		}
	}
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
			a.operatorCreds()
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
