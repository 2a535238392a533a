package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/policy"
)

// policyShadowCmd: toolgate policy shadow push|show|report|promote|drop
// (docs/authorization.md).
func (a *app) policyShadowCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "shadow",
		Short: "Try a candidate policy on live traffic: evaluated beside the live one on every call, enforced on none",
		Args:  subcommand,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	var by string
	var overLive bool
	push := &cobra.Command{
		Use:   "push FILE.rego|DIR",
		Short: "Push a candidate policy; authorize records every call on which it decides otherwise than the live one",
		Example: `  toolgate policy shadow push candidate.rego --over-live   # the live policy with candidate.rego added
  toolgate policy shadow push ./candidate/                  # a whole policy directory`,
		Args: exactArgs(1, "a .rego file or a directory of them"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			modules, data, err := candidate(ctx, c, args[0], overLive)
			if err != nil {
				return err
			}
			if _, err := policy.New(ctx, modules, data); err != nil {
				return err
			}
			res, err := c.PushShadowPolicy(ctx, modules, data, or(by, whoami()))
			if err != nil {
				return err
			}
			return a.emit(res, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "candidate pushed (revision %d, %d modules): evaluated beside the live policy, enforced on none\n", res.Revision, res.Modules)
				return err
			})
		},
	}
	push.Flags().BoolVar(&overLive, "over-live", false, "start from the live policy (the pushed one, else the shipped one) and add or replace the given modules")
	show := &cobra.Command{
		Use:   "show",
		Short: "Show the candidate policy",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			b, err := c.ShadowPolicy(cmd.Context())
			if err != nil {
				return err
			}
			return a.emit(b, func(w io.Writer) error {
				if !b.Pushed {
					_, err := fmt.Fprintln(w, "no candidate policy")
					return err
				}
				fmt.Fprintf(w, "candidate revision %d, pushed %s by %s\n", b.Revision, b.PushedAt.UTC().Format(time.RFC3339), b.PushedBy)
				fmt.Fprintf(w, "digest %s (promote --digest promotes exactly this)\n", b.Digest)
				for name, src := range b.Modules {
					fmt.Fprintf(w, "\n# %s\n%s\n", name, strings.TrimRight(src, "\n"))
				}
				return nil
			})
		},
	}
	var since string
	report := &cobra.Command{
		Use:   "report",
		Short: "Sum up the calls on which the candidate disagreed, by tool, tenant and rule",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var r api.ShadowReportRequest
			if since != "" {
				t, err := pointInTime(since)
				if err != nil {
					return usageErr("--since: %v", err)
				}
				r.Since = &t
			}
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			rep, err := c.ShadowReport(cmd.Context(), r)
			if err != nil {
				return err
			}
			return a.emit(rep, func(w io.Writer) error {
				if rep.Candidate == nil {
					fmt.Fprintln(w, "no candidate policy; divergences recorded for earlier ones:")
				} else {
					fmt.Fprintf(w, "candidate revision %d, pushed %s by %s\n", rep.Candidate.Revision, rep.Candidate.PushedAt.UTC().Format(time.RFC3339), rep.Candidate.PushedBy)
				}
				fmt.Fprintf(w, "%d calls diverged: %d newly denied, %d newly allowed\n", rep.Diverged, rep.NewlyDenied, rep.NewlyAllowed)
				for _, part := range []struct {
					name string
					rows []api.ShadowCount
				}{{"TOOL", rep.ByTool}, {"TENANT", rep.ByTenant}, {"RULE", rep.ByRule}} {
					rows := [][]string{}
					for _, c := range part.rows {
						rows = append(rows, []string{c.Key, fmt.Sprint(c.Calls)})
					}
					fmt.Fprintln(w)
					if err := table(w, []string{part.name, "CALLS"}, rows); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	report.Flags().StringVar(&since, "since", "", "only calls since: an RFC 3339 time or a duration back from now (default: since the candidate was pushed)")
	var digest string
	promote := &cobra.Command{
		Use:     "promote",
		Short:   "Make the candidate the live policy (signed and audited); it is no longer a candidate",
		Example: `  toolgate policy shadow promote --digest sha256:…   # exactly the candidate show printed, or nothing`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			res, err := c.PromoteShownShadowPolicy(cmd.Context(), digest, or(by, whoami()))
			if err != nil {
				return err
			}
			return a.emit(res, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "candidate promoted: live policy revision %d; workers reload it now\n", res.Revision)
				return err
			})
		},
	}
	drop := &cobra.Command{
		Use:   "drop",
		Short: "Remove the candidate policy",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			if err := c.DropShadowPolicy(cmd.Context(), or(by, whoami())); err != nil {
				return err
			}
			return a.emit(map[string]any{"dropped": true}, func(w io.Writer) error {
				_, err := fmt.Fprintln(w, "candidate dropped")
				return err
			})
		},
	}
	promote.Flags().StringVar(&digest, "digest", "", "the candidate's digest as `policy shadow show` printed it: refused if the candidate changed since (default: the candidate read now)")
	for _, c := range []*cobra.Command{push, promote, drop} {
		c.Flags().StringVar(&by, "by", "", "who does it, for the record on a bus without authentication (default: user@host; an authenticated bus records the signing operator)")
	}
	cmd.AddCommand(push, show, report, promote, drop)
	return cmd
}

// candidate reads the candidate's modules and data from a .rego file or a
// directory; with overLive, over the live policy's.
func candidate(ctx context.Context, c *client.Client, path string, overLive bool) (map[string]string, map[string]any, error) {
	var modules map[string]string
	var data map[string]any
	if st, err := os.Stat(path); err != nil {
		return nil, nil, err
	} else if st.IsDir() {
		if modules, data, err = policy.ReadDir(path); err != nil {
			return nil, nil, err
		}
	} else {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, nil, err
		}
		modules = map[string]string{filepath.Base(path): string(b)}
	}
	if !overLive {
		return modules, data, nil
	}
	live, err := c.Policy(ctx)
	if err != nil {
		return nil, nil, err
	}
	base := map[string]string{"authz.rego": policy.DefaultModule()}
	if live.Pushed {
		base = live.Modules
		if data == nil {
			data = live.Data
		}
	}
	out := maps.Clone(base)
	maps.Copy(out, modules)
	return out, data, nil
}
