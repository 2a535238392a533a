package main

import (
	"fmt"
	"io"
	"os"
	"os/user"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/policy"
)

func whoami() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	if h, err := os.Hostname(); err == nil {
		name += "@" + h
	}
	return name
}

func (a *app) policyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Push the Rego policy every worker uses, show the pushed one, or remove it",
		Args:  subcommand,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	var by string
	push := &cobra.Command{
		Use:   "push DIR",
		Short: "Compile a directory of .rego files (and data.json) and push it; every worker reloads it",
		Args:  exactArgs(1, "a directory of .rego files"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			modules, data, err := policy.ReadDir(args[0])
			if err != nil {
				return err
			}
			// Compile here first: a policy that does not compile never reaches a worker.
			if _, err := policy.New(ctx, modules, data); err != nil {
				return err
			}
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			res, err := c.PushPolicy(ctx, modules, data, or(by, whoami()))
			if err != nil {
				return err
			}
			rev := res.Revision
			return a.emit(map[string]any{"revision": rev, "modules": len(modules)}, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "policy pushed (revision %d, %d modules); workers reload it now\n", rev, len(modules))
				return err
			})
		},
	}
	push.Flags().StringVar(&by, "by", "", "who pushes, for the record on a bus without authentication (default: user@host; an authenticated bus records the signing operator)")
	show := &cobra.Command{
		Use:   "show",
		Short: "Show the pushed policy",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			b, err := c.Policy(cmd.Context())
			if err != nil {
				return err
			}
			if !b.Pushed {
				return a.emit(map[string]any{"pushed": false}, func(w io.Writer) error {
					_, err := fmt.Fprintln(w, "no policy pushed: workers use their configured policy (default: the shipped one)")
					return err
				})
			}
			out := map[string]any{"revision": b.Revision, "pushed_at": b.PushedAt, "pushed_by": b.PushedBy, "modules": b.Modules, "data": b.Data}
			return a.emit(out, func(w io.Writer) error {
				fmt.Fprintf(w, "revision %d, pushed %s by %s\n", b.Revision, b.PushedAt.UTC().Format(time.RFC3339), b.PushedBy)
				for name, src := range b.Modules {
					fmt.Fprintf(w, "\n# %s\n%s\n", name, strings.TrimRight(src, "\n"))
				}
				return nil
			})
		},
	}
	reset := &cobra.Command{
		Use:   "reset",
		Short: "Remove the pushed policy (or a promoted candidate): every worker returns to its configured one",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			res, err := c.ResetPolicy(cmd.Context(), or(by, whoami()))
			if err != nil {
				return err
			}
			return a.emit(res, func(w io.Writer) error {
				if res.Removed == 0 {
					_, err := fmt.Fprintln(w, "no policy was pushed: workers use their configured policy (default: the shipped one)")
					return err
				}
				_, err := fmt.Fprintf(w, "policy revision %d removed; workers return to their configured policy (default: the shipped one) now\n", res.Removed)
				return err
			})
		},
	}
	reset.Flags().StringVar(&by, "by", "", "who resets it, for the record on a bus without authentication (default: user@host; an authenticated bus records the signing operator)")
	cmd.AddCommand(push, show, reset, a.policyShadowCmd(), a.policyReplayCmd())
	return cmd
}

func (a *app) breakersCmd() *cobra.Command {
	var by string
	list := func(cmd *cobra.Command, _ []string) error {
		c, done, err := a.adminClient()
		if err != nil {
			return err
		}
		defer done()
		bs, err := c.Breakers(cmd.Context())
		if err != nil {
			return err
		}
		if bs == nil {
			bs = []api.BreakerState{}
		}
		return a.emit(bs, func(w io.Writer) error {
			rows := [][]string{}
			for _, b := range bs {
				forced := ""
				if b.Forced {
					forced = "forced by " + b.By
				}
				rows = append(rows, []string{b.Key, b.State, b.Since.UTC().Format(time.RFC3339), forced})
			}
			return table(w, []string{"KEY", "STATE", "SINCE", ""}, rows)
		})
	}
	cmd := &cobra.Command{
		Use:   "breakers",
		Short: "List circuit breakers, or force one open or closed",
		Args:  noArgs,
		RunE:  list,
	}
	cmd.AddCommand(&cobra.Command{Use: "list", Short: "List circuit breakers", Args: noArgs, RunE: list})
	for _, s := range []struct{ name, state, short string }{
		{"open", api.BreakerOpen, "Force a breaker open: calls are refused until it is closed or released"},
		{"close", api.BreakerClosed, "Force a breaker closed"},
		{"release", api.BreakerRelease, "Hand a forced breaker back to its failure counting"},
	} {
		sub := &cobra.Command{
			Use:   s.name + " KEY",
			Short: s.short,
			Args:  exactArgs(1, "a breaker key"),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, done, err := a.adminClient()
				if err != nil {
					return err
				}
				defer done()
				st, err := c.SetBreaker(cmd.Context(), args[0], s.state, or(by, whoami()))
				if err != nil {
					return err
				}
				return a.emit(st, func(w io.Writer) error {
					_, err := fmt.Fprintf(w, "%s is %s\n", st.Key, st.State)
					return err
				})
			},
		}
		sub.Flags().StringVar(&by, "by", "", "who sets it, for the record on a bus without authentication (default: user@host; an authenticated bus records the signing operator)")
		cmd.AddCommand(sub)
	}
	return cmd
}

func (a *app) approveCmd(approve bool) *cobra.Command {
	var reason, by, digest string
	name := map[bool]string{true: "approve", false: "deny"}[approve]
	cmd := &cobra.Command{
		Use:   name + " ID",
		Short: map[bool]string{true: "Approve a call waiting for a human: it runs", false: "Deny a call waiting for a human: it ends permission_denied"}[approve],
		Args:  exactArgs(1, "an invocation id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			tenant, c, closeFn, err := a.tenantClient()
			if err != nil {
				return err
			}
			defer closeFn()
			signer, err := a.conn.Signer()
			if err != nil {
				return err
			}
			var sign client.Sign
			if signer != nil {
				sign = func(subject string, body []byte) (nats.Header, error) {
					return signer.Sign(nil, subject, body, time.Now())
				}
			}
			d, err := c.DecideSigned(cmd.Context(), api.ApprovalDecision{
				Tenant: tenant, InvocationID: args[0], Approve: approve, DecidedBy: or(by, whoami()), Reason: reason,
				RequestDigest: digest,
			}, sign)
			if err != nil {
				return err
			}
			return a.emit(d, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "%s %s (%s@%s) by %s\n", d.State, d.InvocationID, d.ToolID, d.ToolVersion, d.DecidedBy)
				return err
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the record")
	cmd.Flags().StringVar(&by, "by", "", "who decides, for the record (default: user@host)")
	if approve {
		cmd.Flags().StringVar(&digest, "request-digest", "", "the request_digest `approvals show` gave for the request you reviewed: the approval is refused (E3220) if the parked request is another (default: the request parked now)")
	}
	return cmd
}

func (a *app) approvalsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "approvals",
		Short: "List the calls waiting for a human's approval, or show one",
		Args:  subcommand,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the tenant's calls waiting for approval (parameters redacted)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tenant, c, closeFn, err := a.tenantClient()
			if err != nil {
				return err
			}
			defer closeFn()
			as, err := c.Approvals(cmd.Context(), tenant)
			if err != nil {
				return err
			}
			return a.emit(api.ApprovalsResponse{Approvals: as}, func(w io.Writer) error {
				rows := [][]string{}
				for _, p := range as {
					rows = append(rows, []string{p.InvocationID, p.ToolID + "@" + p.ToolVersion, p.Deadline.UTC().Format(time.RFC3339),
						strings.Join(p.Reasons, "; "), truncate(compact(p.Parameters), 60)})
				}
				return table(w, []string{"INVOCATION", "TOOL", "DEADLINE", "REASONS", "PARAMETERS"}, rows)
			})
		},
	}
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show one call's approval: state, reasons, parameters (redacted), deadline, decision",
		Args:  exactArgs(1, "an invocation id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			tenant, c, closeFn, err := a.tenantClient()
			if err != nil {
				return err
			}
			defer closeFn()
			p, err := c.Approval(cmd.Context(), tenant, args[0])
			if err != nil {
				return err
			}
			return a.emit(p, func(w io.Writer) error {
				rows := [][]string{
					{"tool:", p.ToolID + "@" + p.ToolVersion}, {"tenant:", p.Tenant}, {"agent:", p.AgentDID},
					{"requested:", p.RequestedAt.UTC().Format(time.RFC3339)}, {"deadline:", p.Deadline.UTC().Format(time.RFC3339)},
					{"reasons:", strings.Join(p.Reasons, "; ")},
				}
				if !p.DecidedAt.IsZero() {
					rows = append(rows, []string{"decided:", p.DecidedAt.UTC().Format(time.RFC3339) + " by " + p.DecidedBy + " " + p.Reason})
				}
				if err := table(w, []string{p.InvocationID, p.State}, rows); err != nil {
					return err
				}
				if len(p.Parameters) > 0 {
					fmt.Fprintln(w, "parameters (redacted):")
					fmt.Fprintln(w, indentJSON(p.Parameters, "  "))
				}
				if p.State == "pending" {
					fmt.Fprintf(w, "decide: toolgate approve %s --tenant %s   (or deny)\n", p.InvocationID, p.Tenant)
				}
				return nil
			})
		},
	}
	cmd.AddCommand(list, show)
	return cmd
}

func compact(b []byte) string { return strings.Join(strings.Fields(string(b)), " ") }

func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print toolgate's version and the versions of the modules it is built from",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			bi, ok := debug.ReadBuildInfo()
			if !ok {
				return fmt.Errorf("no build information in this binary")
			}
			type mod struct {
				Path    string `json:"path"`
				Version string `json:"version"`
			}
			out := struct {
				Version   string            `json:"version"`
				GoVersion string            `json:"go_version"`
				Platform  string            `json:"platform"`
				Settings  map[string]string `json:"settings,omitempty"`
				Deps      []mod             `json:"modules"`
			}{Version: bi.Main.Version, GoVersion: bi.GoVersion, Platform: runtime.GOOS + "/" + runtime.GOARCH, Settings: map[string]string{}}
			for _, s := range bi.Settings {
				if strings.HasPrefix(s.Key, "vcs.") {
					out.Settings[s.Key] = s.Value
				}
			}
			for _, d := range bi.Deps {
				v := d.Version
				if d.Replace != nil {
					v += " => " + d.Replace.Path + " " + d.Replace.Version
				}
				out.Deps = append(out.Deps, mod{d.Path, v})
			}
			return a.emit(out, func(w io.Writer) error {
				fmt.Fprintf(w, "toolgate %s (%s, %s)\n", or(out.Version, "(devel)"), out.GoVersion, out.Platform)
				if r := out.Settings["vcs.revision"]; r != "" {
					fmt.Fprintf(w, "revision %s %s\n", r, out.Settings["vcs.time"])
				}
				rows := [][]string{}
				for _, d := range out.Deps {
					rows = append(rows, []string{d.Path, d.Version})
				}
				fmt.Fprintln(w)
				return table(w, []string{"MODULE", "VERSION"}, rows)
			})
		},
	}
}
