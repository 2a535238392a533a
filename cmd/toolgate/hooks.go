package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/internal/hooks"
	"github.com/toolgate/toolgate/subjects"
	"go.yaml.in/yaml/v3"
)

func (a *app) hooksCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "hooks",
		Short: "Push, list or delete a tenant's hooks (what follows a denied, failed, timed-out or overspent call)",
		Args:  subcommand,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	var tenant, by string
	push := &cobra.Command{
		Use:   "push FILE",
		Short: "Compile a hook set (YAML or JSON, {hooks: [...]}) and make it the tenant's; audit workers use it at once",
		Args:  exactArgs(1, "a hook set file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := subjects.CheckTenant(tenant); err != nil {
				return err
			}
			doc, err := readHookSet(args[0])
			if err != nil {
				return err
			}
			// Compile here first: hooks that do not compile never reach a worker.
			set, err := hooks.Parse(doc, hooks.SourceTenant)
			if err != nil {
				return err
			}
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			res, err := c.PushHooks(cmd.Context(), tenant, doc, or(by, whoami()))
			if err != nil {
				return err
			}
			rev := res.Revision
			return a.emit(map[string]any{"tenant": tenant, "revision": rev, "hooks": len(set.Specs)}, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "hooks of %s pushed (revision %d, %d hooks)\n", tenant, rev, len(set.Specs))
				return err
			})
		},
	}
	push.Flags().StringVar(&tenant, "tenant", "", "the tenant the hooks are for (required)")
	push.Flags().StringVar(&by, "by", "", "who pushes, for the record on a bus without authentication (default: user@host; an authenticated bus records the signing operator)")
	_ = push.MarkFlagRequired("tenant")

	var listTenant string
	list := &cobra.Command{
		Use:   "list",
		Short: "List the tenants' hooks",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			sets, err := c.HookSets(cmd.Context(), listTenant)
			if err != nil {
				return err
			}
			type row struct {
				Tenant   string       `json:"tenant"`
				Revision uint64       `json:"revision"`
				PushedAt time.Time    `json:"pushed_at"`
				PushedBy string       `json:"pushed_by,omitempty"`
				Hooks    []hooks.Spec `json:"hooks"`
			}
			rows := []row{}
			for _, s := range sets {
				var d hooks.Doc
				_ = json.Unmarshal(s.Doc, &d)
				rows = append(rows, row{s.TenantID, s.Revision, s.PushedAt, s.PushedBy, d.Hooks})
			}
			return a.emit(rows, func(w io.Writer) error {
				if len(rows) == 0 {
					_, err := fmt.Fprintln(w, "no hooks pushed")
					return err
				}
				for _, r := range rows {
					fmt.Fprintf(w, "%s (revision %d, pushed %s by %s)\n", r.Tenant, r.Revision, r.PushedAt.UTC().Format(time.RFC3339), r.PushedBy)
					for i, h := range r.Hooks {
						name := h.Name
						if name == "" {
							name = fmt.Sprintf("%s-%d", h.On, i)
						}
						line := fmt.Sprintf("  %-20s on %-17s → %s", name, h.On, h.Action)
						if h.Fallback != nil {
							line += " " + strings.TrimSpace(h.Fallback.ToolID+" "+h.Fallback.ToolVersion)
						}
						if h.Condition != "" {
							line += "  if " + h.Condition
						}
						if len(h.Tools) > 0 {
							line += "  tools " + strings.Join(h.Tools, ",")
						}
						fmt.Fprintln(w, line)
					}
				}
				return nil
			})
		},
	}
	list.Flags().StringVar(&listTenant, "tenant", "", "only this tenant's hooks")

	var delTenant string
	del := &cobra.Command{
		Use:   "delete",
		Short: "Remove a tenant's hooks",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := subjects.CheckTenant(delTenant); err != nil {
				return err
			}
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			if err := c.DeleteHooks(cmd.Context(), delTenant, whoami()); err != nil {
				return err
			}
			return a.emit(map[string]any{"tenant": delTenant, "deleted": true}, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "hooks of %s removed\n", delTenant)
				return err
			})
		},
	}
	del.Flags().StringVar(&delTenant, "tenant", "", "the tenant whose hooks to remove (required)")
	_ = del.MarkFlagRequired("tenant")
	cmd.AddCommand(push, list, del)
	return cmd
}

// readHookSet reads a hook set file in YAML (JSON is YAML too) and returns
// it as JSON.
func readHookSet(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return json.Marshal(doc)
}
