package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/modelrouter"
)

// modelsCmd manages the model catalogue (docs/models.md).
func (a *app) modelsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "models", Short: "Manage the model catalogue the model kind routes over", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() }}
	register := &cobra.Command{
		Use: "register FILE", Short: "Register or replace a model from its JSON document", Args: exactArgs(1, "a model document"),
		RunE: func(cmd *cobra.Command, args []string) error {
			doc, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			raw, err := c.RegisterModel(cmd.Context(), doc, whoami())
			if err != nil {
				return err
			}
			var m modelrouter.Model
			if err := json.Unmarshal(raw, &m); err != nil {
				return err
			}
			return a.emit(m, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "registered %s (%s, %s tier)\n", m.Name, m.API, m.Tier)
				return err
			})
		},
	}
	list := &cobra.Command{
		Use: "list", Short: "List the registered models", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			raws, err := c.Models(cmd.Context())
			if err != nil {
				return err
			}
			ms := make([]modelrouter.Model, 0, len(raws))
			for _, raw := range raws {
				var m modelrouter.Model
				if err := json.Unmarshal(raw, &m); err != nil {
					return err
				}
				ms = append(ms, m)
			}
			return a.emit(ms, func(w io.Writer) error { return modelTable(w, ms) })
		},
	}
	del := &cobra.Command{
		Use: "delete NAME", Short: "Remove a model from the catalogue", Args: exactArgs(1, "a model name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			return c.DeleteModel(cmd.Context(), args[0], whoami())
		},
	}
	var reset bool
	policy := &cobra.Command{
		Use: "policy (FILE.rego | --reset)", Short: "Replace the Rego routing policy, or restore the shipped one", Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if reset == (len(args) == 1) {
				return usageErr("models policy: give a policy file or --reset")
			}
			var src []byte
			if !reset {
				var err error
				if src, err = os.ReadFile(args[0]); err != nil {
					return err
				}
			}
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			return c.SetRoutingPolicy(cmd.Context(), string(src), whoami())
		},
	}
	policy.Flags().BoolVar(&reset, "reset", false, "restore the shipped routing policy")
	var sr api.ModelStatsRequest
	stats := &cobra.Command{
		Use: "stats", Short: "Show model statistics across the cluster: latency, success rate, failures, tokens and cost per model and task type",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			out, err := c.ModelStats(cmd.Context(), sr)
			if err != nil {
				return err
			}
			return a.emit(out, func(w io.Writer) error { return modelStatsTable(w, out.Models) })
		},
	}
	sf := stats.Flags()
	sf.StringVar(&sr.Model, "model", "", "only this model")
	sf.StringVar(&sr.TaskType, "task-type", "", "only this task type (none: calls naming none; other: types the rules do not score)")
	sf.BoolVar(&sr.ByModel, "by-model", false, "merge each model's task types")
	cmd.AddCommand(register, list, del, policy, stats)
	return cmd
}

func modelStatsTable(w io.Writer, ms []api.ModelStats) error {
	rows := make([][]string, 0, len(ms))
	for _, s := range ms {
		rows = append(rows, []string{s.Model, s.TaskType, strconv.FormatInt(s.Calls, 10), fmt.Sprintf("%.1f%%", 100*s.SuccessRate),
			fmt.Sprintf("%.0f", s.P50MS), fmt.Sprintf("%.0f", s.P95MS), strconv.FormatInt(s.InputTokens+s.OutputTokens, 10),
			fmt.Sprintf("%.4g", s.Cost)})
	}
	return table(w, []string{"MODEL", "TASK", "CALLS", "SUCCESS", "P50 MS", "P95 MS", "TOKENS", "COST"}, rows)
}

func modelTable(w io.Writer, ms []modelrouter.Model) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tAPI\tTIER\tCONTEXT\tENDPOINTS")
	for _, m := range ms {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\n", m.Name, m.API, m.Tier, m.ContextWindow, len(m.Endpoints))
	}
	return tw.Flush()
}

// budgetsCmd shows where a session's budget stands.
func (a *app) budgetsCmd() *cobra.Command {
	var session string
	var l api.BudgetLimits
	show := &cobra.Command{
		Use: "show [--session token:JTI]", Short: "Show a token tree's used and remaining budget, spending rate and projected depletion", Args: noArgs,
		Long: `Show a budget's used and remaining amounts, spending rate and projected
depletion. Budgets are kept per token tree, under token:<root token id>,
whatever session_id the calls name: without --session, the budget of the
capability token in use (--token, TOOLGATE_TOKEN, the development token).`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case session == "":
				var err error
				if session, err = a.budgetKey(); err != nil {
					return err
				}
			case !strings.HasPrefix(session, "token:"):
				// A session_id names no budget: showing its (always empty)
				// usage would read as "nothing spent".
				return usageErr("budgets show: budgets are kept per token tree (token:<root token id>), not per session_id %q: leave --session out for the token in use, or give --session token:<jti>", session)
			}
			tenant, err := a.tenant()
			if err != nil {
				return err
			}
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			st, err := c.Budget(cmd.Context(), tenant, session, l)
			if err != nil {
				return err
			}
			return a.printJSON(st)
		},
	}
	f := show.Flags()
	f.StringVar(&session, "session", "", "budget key token:<root token id> (default: the capability token's)")
	f.Int64Var(&l.MaxTokens, "max-tokens", 0, "the budget's max_tokens, for what remains")
	f.Float64Var(&l.MaxCost, "max-cost", 0, "the budget's max_cost")
	f.Int64Var(&l.MaxCalls, "max-calls", 0, "the budget's max_calls")
	f.Int64Var(&l.MaxRuntimeMS, "max-runtime-ms", 0, "the budget's max_runtime_ms")
	cmd := &cobra.Command{Use: "budgets", Short: "Session budgets", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() }}
	cmd.AddCommand(show)
	return cmd
}
