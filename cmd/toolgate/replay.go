package main

import (
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/policy"
)

// policyReplayCmd: toolgate policy replay CANDIDATE [--since 24h]
// (docs/authorization.md).
func (a *app) policyReplayCmd() *cobra.Command {
	var since string
	var overLive bool
	cmd := &cobra.Command{
		Use:   "replay FILE.rego|DIR",
		Short: "Evaluate a candidate policy against the decision inputs authorize recorded, and print what would change",
		Long: `Authorize records each call's policy input (parameters redacted as audit redacts them) and its
decision when serve runs with --record-decisions. replay evaluates a candidate, here, against
those records and prints every call it would decide otherwise. Nothing is pushed.`,
		Args: exactArgs(1, "a .rego file or a directory of them"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			from, err := pointInTime(since)
			if err != nil {
				return usageErr("--since: %v", err)
			}
			nc, err := a.conn.Connect()
			if err != nil {
				return err
			}
			defer nc.Close()
			c, err := client.New(nc)
			if err != nil {
				return err
			}
			if signer, err := a.conn.Signer(); err != nil {
				return err
			} else if signer != nil {
				c.Sign = func(subject string, body []byte) (nats.Header, error) {
					return signer.Sign(nil, subject, body, time.Now())
				}
			}
			modules, data, err := candidate(ctx, c, args[0], overLive)
			if err != nil {
				return err
			}
			engine, err := policy.New(ctx, modules, data)
			if err != nil {
				return err
			}
			recs, err := c.RecordedDecisions(ctx, from)
			if err != nil {
				return err
			}
			res := policy.Replay(ctx, engine, recs)
			return a.emit(res, func(w io.Writer) error {
				rows := [][]string{}
				for _, ch := range res.Changes {
					rows = append(rows, []string{ch.Time.UTC().Format(time.RFC3339), ch.TenantID, ch.ToolID, ch.InvocationID,
						verdict(ch.Live) + " -> " + verdict(ch.Candidate), firstReason(ch.Candidate.Reasons)})
				}
				if len(rows) > 0 {
					if err := table(w, []string{"TIME", "TENANT", "TOOL", "INVOCATION", "DECISION", "CANDIDATE'S REASON"}, rows); err != nil {
						return err
					}
				}
				_, err := fmt.Fprintf(w, "%d recorded calls, %d would change: %d newly denied, %d newly allowed\n",
					res.Recorded, res.Changed, res.NewlyDenied, res.NewlyAllowed)
				return err
			})
		},
	}
	cmd.Flags().StringVar(&since, "since", "24h", "recorded since: an RFC 3339 time or a duration back from now")
	cmd.Flags().BoolVar(&overLive, "over-live", false, "start from the live policy (the pushed one, else the shipped one) and add or replace the given modules")
	return cmd
}

func verdict(d api.ShadowDecision) string {
	switch {
	case d.Allow && d.RequiresApproval:
		return "approval"
	case d.Allow:
		return "allow"
	}
	return "deny"
}

func firstReason(ss []string) string {
	if len(ss) == 0 {
		return ""
	}
	return ss[0]
}
