package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/api"
)

func (a *app) toolsSearchCmd() *cobra.Command {
	var r api.ListRequest
	var callable, all bool
	cmd := &cobra.Command{
		Use:   "search [WORDS...]",
		Short: "Search, filter and rank the tools (by match, usage, latency, cost and safety)",
		Long: `Search the registered tools: words are looked for in ids, names,
descriptions, tags and capabilities; filters keep only what they allow.
With words or --capability the tools are ranked by
0.4·match + 0.2·usage + 0.15·latency + 0.15·cost + 0.1·safety, usage and
latency coming from the calls toolgate has seen (toolgate tools stats).
--callable keeps the tools the capability token (--token, or the local
development token) may call, asking on its tenant's endpoint.`,
		Example: `  toolgate tools search read file --risk-max medium --exclude-side-effect network
  toolgate tools search --capability parse_json --callable --json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			r.Query = strings.Join(args, " ")
			tenant := ""
			if callable {
				r.CapabilityToken = a.capToken()
				if r.CapabilityToken == "" {
					return usageErr("--callable needs a capability token (--token)")
				}
				var err error
				if tenant, err = a.tenant(); err != nil {
					return err
				}
			}
			c, closeFn, err := a.client()
			if err != nil {
				return err
			}
			defer closeFn()
			out, err := c.SearchTools(cmd.Context(), tenant, r)
			for err == nil && all && out.NextCursor != "" {
				r.Cursor = out.NextCursor
				var next api.ListResponse
				next, err = c.SearchTools(cmd.Context(), tenant, r)
				out.Tools, out.NextCursor = append(out.Tools, next.Tools...), next.NextCursor
			}
			if err != nil {
				return err
			}
			return a.emit(out, func(w io.Writer) error {
				rows := make([][]string, 0, len(out.Tools))
				for _, t := range out.Tools {
					score := "-"
					if t.Terms != nil {
						score = strconv.FormatFloat(t.Score, 'f', 3, 64)
					}
					rows = append(rows, []string{score, t.ToolID, t.LatestVersion, t.Kind, or(t.RiskLevel, "-"), or(t.State, "-"), truncate(t.Description, 50)})
				}
				if err := table(w, []string{"SCORE", "TOOL", "LATEST", "KIND", "RISK", "STATE", "DESCRIPTION"}, rows); err != nil {
					return err
				}
				if out.NextCursor != "" {
					_, err := fmt.Fprintf(w, "%d of %d; next page: --cursor %s\n", len(out.Tools), out.TotalCount, out.NextCursor)
					return err
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&r.Capabilities, "capability", nil, "capability tag wanted (repeatable)")
	f.StringVar(&r.Category, "category", "", "only this category")
	f.StringVar(&r.Tag, "tag", "", "only tools with this tag")
	f.StringVar(&r.RiskLevelMax, "risk-max", "", "leave out tools riskier than low, medium, high or critical")
	f.StringSliceVar(&r.ExcludeSideEffects, "exclude-side-effect", nil, "leave out tools with this side effect or a sub-tag of it (repeatable)")
	f.StringSliceVar(&r.SourceTypes, "source", nil, "only tools of these kinds: builtin, http, cli, mcp, model (repeatable)")
	f.BoolVar(&r.EnabledOnly, "enabled-only", false, "leave out tools whose latest version is deprecated")
	f.BoolVar(&callable, "callable", false, "only tools the capability token may call")
	f.IntVar(&r.PageSize, "page-size", 0, "tools per page (default 50, at most 200)")
	f.StringVar(&r.Cursor, "cursor", "", "the next page of an earlier search with the same words and filters")
	f.BoolVar(&all, "all", false, "fetch every page")
	return cmd
}

func (a *app) toolsStatsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "stats [ID]",
		Short: "Show tool usage statistics: calls, success rate, latency percentiles, cost",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, closeFn, err := a.client()
			if err != nil {
				return err
			}
			defer closeFn()
			id := ""
			if len(args) == 1 {
				id = args[0]
			}
			out, err := c.ToolStats(cmd.Context(), id)
			if err != nil {
				return err
			}
			return a.emit(out, func(w io.Writer) error {
				rows := make([][]string, 0, len(out.Tools))
				for _, s := range out.Tools {
					rows = append(rows, []string{s.ToolID, strconv.FormatInt(s.Calls, 10), fmt.Sprintf("%.1f%%", 100*s.SuccessRate),
						fmt.Sprintf("%.0f", s.P50MS), fmt.Sprintf("%.0f", s.P95MS), fmt.Sprintf("%.0f", s.P99MS), fmt.Sprintf("%.4g", s.Cost)})
				}
				return table(w, []string{"TOOL", "CALLS", "SUCCESS", "P50 MS", "P95 MS", "P99 MS", "COST"}, rows)
			})
		},
	}
}

func (a *app) capabilityCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "capability",
		Short: "Ask for a capability (a capability_request) and read its run report",
		Args:  subcommand,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.capabilityRequestCmd(), a.capabilityReportCmd())
	return cmd
}

func (a *app) capabilityRequestCmd() *cobra.Command {
	var noToken bool
	cmd := &cobra.Command{
		Use:   "request FILE",
		Short: "Send a capability request (JSON; - reads stdin) for the token's tenant",
		Long: `Send a capability request: the registered tools that offer the capability
within its constraints come back ranked, and, when the operator's policy
(toolgate.capability.grant) allows it, a child token attenuated from the
capability token (--token, or the local development token) for exactly the
granted tools. Constraints left out are the restrictive defaults: no
network, read-only input, 1000 ms, 64 MB.`,
		Example: `  echo '{"kind":"capability_request","capability":"parse_json","input_contract":"JSON text",
    "output_contract":"the value","reason":"too long to read","constraints":{"max_runtime_ms":5000}}' |
    toolgate capability request -`,
		Args: exactArgs(1, "a request file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			doc, err := a.readFile(args[0])
			if err != nil {
				return err
			}
			if tok := a.capToken(); !noToken && tok != "" && !strings.Contains(string(doc), `"capability_token"`) {
				doc, err = withMember(doc, "capability_token", tok)
				if err != nil {
					return usageErr("the request is not a JSON object: %v", err)
				}
			}
			tenant, c, closeFn, err := a.tenantClient()
			if err != nil {
				return err
			}
			defer closeFn()
			out, err := c.RequestCapabilityJSON(cmd.Context(), tenant, doc)
			if err != nil {
				return err
			}
			if err := a.emit(out, func(w io.Writer) error { return renderCapability(w, out) }); err != nil {
				return err
			}
			if out.Refusal != nil && out.Outcome == api.CapabilityRefused {
				return &codeError{code: exitError, err: out.Refusal, shown: true}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&noToken, "no-token", false, "send no capability token: candidates only, no grant")
	return cmd
}

func renderCapability(w io.Writer, out api.CapabilityResponse) error {
	fmt.Fprintf(w, "request %s: %s\n", out.RequestID, out.Outcome)
	for _, c := range out.Candidates {
		fmt.Fprintf(w, "  %.3f  %s@%s\n", c.Score, c.ToolID, c.Version)
	}
	for id, why := range out.Considered {
		fmt.Fprintf(w, "  left out %s: %s\n", id, why)
	}
	if g := out.Grant; g != nil {
		fmt.Fprintf(w, "granted %s until %s (token %s: at most %d calls, %d ms)\n",
			strings.Join(g.Tools, ", "), g.ExpiresAt.Format("15:04:05Z07:00"), g.TokenID, g.MaxCalls, g.MaxRuntimeMS)
		if g.Token != "" {
			fmt.Fprintf(w, "token: %s\n", g.Token)
		}
	}
	if out.Refusal != nil {
		fmt.Fprintf(w, "%s (%s): %s\n", out.Refusal.Code, out.Refusal.ECode, out.Refusal.Message)
	}
	return nil
}

func (a *app) capabilityReportCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "report REQUEST-ID",
		Short: "Show what a capability request asked, matched, was granted, used and cost",
		Args:  exactArgs(1, "a request id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			tenant, c, closeFn, err := a.tenantClient()
			if err != nil {
				return err
			}
			defer closeFn()
			rep, err := c.CapabilityReport(cmd.Context(), tenant, args[0])
			if err != nil {
				return err
			}
			return a.emit(rep, func(w io.Writer) error {
				fmt.Fprintf(w, "request %s of %s at %s by %s: %q (%s)\n", rep.RequestID, rep.Tenant,
					rep.RequestedAt.Format("2006-01-02 15:04:05Z07:00"), or(rep.RequestedBy, "-"), rep.Request.Capability, rep.Request.Reason)
				if err := renderCapability(w, rep.Response); err != nil {
					return err
				}
				if u := rep.Used; u != nil {
					fmt.Fprintf(w, "used: %d calls, %d ms, cost %.4g, %d failures in a row\n", u.Calls, u.RuntimeMS, u.Cost, u.ConsecutiveFailures)
				}
				return nil
			})
		},
	}
}

// withMember sets one member of a JSON object document.
func withMember(doc []byte, key string, v any) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(doc, &m); err != nil {
		return nil, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	m[key] = b
	return json.Marshal(m)
}
