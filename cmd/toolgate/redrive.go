package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/connect"
)

// redriveCmd: toolgate redrive list|show|run (docs/redrive.md).
func (a *app) redriveCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "redrive",
		Short: "List, show and re-run calls that ended on failures whose cause may have passed",
		Long: `Calls that ended on a delivery limit, a poison message, an open breaker, a rate
limit or a provider's outage (` + strings.Join(api.RedrivableCodes(), ", ") + `) are kept
in a dead-letter stream with their request, never their token. A re-drive is a new
invocation linked to the original, judged by every stage again; it needs the
caller's token, still valid, or an operator's decision with a reason.`,
		Args: subcommand,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.redriveListCmd(), a.redriveShowCmd(), a.redriveRunCmd())
	return cmd
}

// redriveFilter reads the filter flags shared by list and run.
type redriveFilter struct{ code, since string }

func (f *redriveFilter) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.code, "code", "", "only calls that ended with this E-code (E3401)")
	cmd.Flags().StringVar(&f.since, "since", "", "only calls that ended since: an RFC 3339 time or a duration back from now (24h)")
}

func (f *redriveFilter) filter(tenant string) (api.RedriveFilter, error) {
	out := api.RedriveFilter{Tenant: tenant, Code: f.code}
	if f.since != "" {
		t, err := pointInTime(f.since)
		if err != nil {
			return out, usageErr("--since: %v", err)
		}
		out.Since = &t
	}
	return out, nil
}

func (a *app) redriveListCmd() *cobra.Command {
	var f redriveFilter
	var limit int
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List a tenant's dead letters, oldest first, with what became of their re-drive",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tenant, err := a.tenant()
			if err != nil {
				return err
			}
			flt, err := f.filter(tenant)
			if err != nil {
				return err
			}
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			l, err := c.RedriveList(cmd.Context(), api.RedriveListRequest{RedriveFilter: flt, Limit: limit})
			if err != nil {
				return err
			}
			return a.emit(l, func(w io.Writer) error {
				rows := [][]string{}
				for _, e := range l.Entries {
					rows = append(rows, []string{e.InvocationID, e.ToolID, e.Code, e.EndedAt.UTC().Format(time.RFC3339), redriveState(e.RedriveStatus)})
				}
				if err := table(w, []string{"INVOCATION", "TOOL", "CODE", "ENDED", "RE-DRIVE"}, rows); err != nil {
					return err
				}
				if l.More {
					_, err = fmt.Fprintf(w, "(more: raise --limit or narrow with --code and --since)\n")
				}
				return err
			})
		},
	}
	f.flags(cmd)
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many (default 100, at most 10000)")
	return cmd
}

func redriveState(s api.Status) string {
	if s == "" {
		return "not run"
	}
	return string(s)
}

func (a *app) redriveShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "show ID",
		Short: "Show one dead letter: the request (parameters redacted) and how it ended",
		Args:  exactArgs(1, "an invocation id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			tenant, err := a.tenant()
			if err != nil {
				return err
			}
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			d, err := c.RedriveShow(cmd.Context(), tenant, args[0])
			if err != nil {
				return err
			}
			return a.emit(d, func(w io.Writer) error {
				code, msg := "", ""
				if d.Error != nil {
					code, msg = d.Error.ECode, d.Error.Message
				}
				return table(w, []string{"", ""}, [][]string{
					{"invocation:", d.InvocationID}, {"tenant:", d.Tenant}, {"tool:", d.ToolID + "@" + d.ToolVersion},
					{"agent:", d.Request.AgentContext.AgentDID}, {"ended:", d.EndedAt.UTC().Format(time.RFC3339) + " by " + d.EndedBy},
					{"error:", code + " " + msg}, {"parameters:", string(d.Request.Parameters)},
					{"re-drive:", d.RedriveID + " (" + redriveState(d.RedriveStatus) + ")"},
					{"digest:", d.Digest + " (run --digest re-drives exactly this)"},
				})
			})
		},
	}
}

func (a *app) redriveRunCmd() *cobra.Command {
	var f redriveFilter
	var all, decision, wait bool
	var waitFor time.Duration
	var reason, callerToken, by string
	var digests []string
	cmd := &cobra.Command{
		Use:   "run ID...|--filter",
		Short: "Re-drive dead letters as new invocations, with the caller's token or on an operator's decision",
		Example: `  toolgate redrive run 4f1c… --caller-token "$AGENT_TOKEN" --wait
  toolgate redrive run --filter --code E3401 --since 1h --caller-token "$AGENT_TOKEN" --tenant acme
  toolgate redrive run 4f1c… --decision --reason "provider outage over" --digest sha256:… --tenant acme`,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case all == (len(args) > 0):
				return usageErr("name the calls to re-drive, or --filter (with --code and --since), not both")
			case decision == (callerToken != ""):
				return usageErr("give the caller's token (--caller-token) or an operator's --decision, exactly one")
			case decision && reason == "":
				return usageErr("--decision needs a --reason, which is recorded")
			case all && len(digests) > 0:
				return usageErr("--digest names calls shown one by one, not a --filter")
			case len(digests) > 0 && len(digests) != len(args):
				return usageErr("give one --digest per call, in the order of the calls")
			case decision && !all && len(digests) == 0:
				return usageErr("--decision re-drives exactly what you were shown: give each call's --digest, as `redrive show` prints it")
			}
			if callerToken == "-" {
				b, err := io.ReadAll(os.Stdin)
				if err != nil {
					return err
				}
				callerToken = strings.TrimSpace(string(b))
			}
			tenant, err := a.conn.TenantFor(callerToken)
			if errors.Is(err, connect.ErrNoTenant) {
				return usageErr("name the tenant (--tenant)")
			}
			if err != nil {
				return err
			}
			r := api.RedriveRunRequest{Tenant: tenant, IDs: args, Decision: decision, Reason: reason, By: or(by, whoami())}
			for i, dg := range digests {
				if r.Digests == nil {
					r.Digests = map[string]string{}
				}
				r.Digests[args[i]] = dg
			}
			if all {
				flt, err := f.filter(tenant)
				if err != nil {
					return err
				}
				r.Filter = &flt
			}
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			out, err := c.RedriveRun(cmd.Context(), r, callerToken)
			if err != nil {
				return err
			}
			statuses := map[string]api.Status{}
			failed := 0
			for _, run := range out.Runs {
				if run.Error != nil {
					failed++
					continue
				}
				if wait {
					wctx, cancel := context.WithTimeout(cmd.Context(), waitFor)
					resp, err := c.Wait(wctx, tenant, run.RedriveID)
					cancel()
					if err != nil {
						return err
					}
					statuses[run.RedriveID] = resp.Status
					if resp.Status != api.StatusSuccess {
						failed++
					}
				}
			}
			err = a.emit(out, func(w io.Writer) error {
				rows := [][]string{}
				for _, run := range out.Runs {
					state := "started"
					if run.Error != nil {
						state = run.Error.ECode + " " + run.Error.Message
					} else if st, ok := statuses[run.RedriveID]; ok {
						state = string(st)
					}
					rows = append(rows, []string{run.Original, run.RedriveID, state})
				}
				return table(w, []string{"ORIGINAL", "RE-DRIVE", "STATE"}, rows)
			})
			if err == nil && failed > 0 {
				return &codeError{code: exitError, err: fmt.Errorf("%d of %d re-drives did not succeed", failed, len(out.Runs)), shown: true}
			}
			return err
		},
	}
	f.flags(cmd)
	fl := cmd.Flags()
	fl.BoolVar(&all, "filter", false, "re-drive every dead letter of the tenant that --code and --since select")
	fl.StringVar(&callerToken, "caller-token", "", "the caller's capability token, still valid, each re-drive runs on (- reads it from stdin)")
	fl.BoolVar(&decision, "decision", false, "re-drive without the caller's token, as the original's verified claims, on your recorded decision")
	fl.StringVar(&reason, "reason", "", "why (recorded; required with --decision)")
	fl.StringArrayVar(&digests, "digest", nil, "a call's digest as `redrive show` printed it, one per call in order: a dead letter changed since is not re-driven (required with --decision)")
	fl.BoolVar(&wait, "wait", false, "wait for each re-drive's result and print its status")
	fl.DurationVar(&waitFor, "wait-timeout", 2*time.Minute, "with --wait, how long to wait for each re-drive")
	fl.StringVar(&by, "by", "", "who runs it, for the record on a bus without authentication (default: user@host; an authenticated bus records the signing operator)")
	return cmd
}
