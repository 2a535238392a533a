package main

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/api"
)

func (a *app) checkpointsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "checkpoints",
		Short: "List, show or delete the tenant's checkpoints",
		Long: `Checkpoints are the states long-running tools save as they go: micro ones
(resumable for an hour), macro ones at milestones (kept for the operator's
retention) and named ones (kept until deleted). Resume a call from one with
toolgate invoke --resume-from ID. An agent sees its own tenant's.`,
		Args: subcommand,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	var inv string
	list := &cobra.Command{
		Use:   "list",
		Short: "List the tenant's checkpoints, oldest first",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tenant, c, closeFn, err := a.tenantClient()
			if err != nil {
				return err
			}
			defer closeFn()
			cps, err := c.Checkpoints(cmd.Context(), tenant, inv)
			if err != nil {
				return err
			}
			return a.emit(cps, func(w io.Writer) error {
				rows := [][]string{}
				for _, cp := range cps {
					rows = append(rows, []string{cp.ID, kindOf(cp), cp.ToolID, cp.CreatedAt.UTC().Format(time.RFC3339),
						expiry(cp), strconv.Itoa(cp.StateBytes), strconv.Itoa(cp.StoredBytes)})
				}
				return table(w, []string{"CHECKPOINT", "KIND", "TOOL", "CREATED", "EXPIRES", "BYTES", "STORED"}, rows)
			})
		},
	}
	list.Flags().StringVar(&inv, "invocation", "", "only this invocation's checkpoints")
	var withState bool
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show one checkpoint: kind, parent, sizes, expiry; --state prints the state",
		Args:  exactArgs(1, "a checkpoint id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			tenant, c, closeFn, err := a.tenantClient()
			if err != nil {
				return err
			}
			defer closeFn()
			cp, err := c.Checkpoint(cmd.Context(), tenant, args[0], withState)
			if err != nil {
				return err
			}
			return a.emit(cp, func(w io.Writer) error {
				stored := strconv.Itoa(cp.StoredBytes) + " bytes, " + cp.Encoding
				if cp.Delta {
					stored += fmt.Sprintf(", a delta of its parent (depth %d)", cp.Depth)
				}
				rows := [][]string{
					{"kind:", kindOf(cp.Checkpoint)}, {"invocation:", cp.InvocationID}, {"tool:", cp.ToolID + "@" + cp.ToolVersion},
					{"parent:", cp.Parent}, {"created:", cp.CreatedAt.UTC().Format(time.RFC3339)}, {"expires:", expiry(cp.Checkpoint)},
					{"state:", strconv.Itoa(cp.StateBytes) + " bytes"}, {"stored:", stored},
				}
				if len(cp.DocumentPins) > 0 {
					rows = append(rows, []string{"document pins:", compact(cp.DocumentPins)})
				}
				if err := table(w, []string{cp.ID, ""}, rows); err != nil {
					return err
				}
				if len(cp.State) > 0 {
					fmt.Fprintln(w, "state:")
					fmt.Fprintln(w, indentJSON(cp.State, "  "))
				}
				return nil
			})
		},
	}
	show.Flags().BoolVar(&withState, "state", false, "print the saved state too")
	del := &cobra.Command{
		Use:   "delete ID",
		Short: "Delete one checkpoint (refused while a later one is stored as a delta of it)",
		Args:  exactArgs(1, "a checkpoint id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			tenant, c, closeFn, err := a.tenantClient()
			if err != nil {
				return err
			}
			defer closeFn()
			cp, err := c.DeleteCheckpoint(cmd.Context(), tenant, args[0])
			if err != nil {
				return err
			}
			return a.emit(cp, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "deleted %s (%s)\n", cp.ID, kindOf(cp))
				return err
			})
		},
	}
	cmd.AddCommand(list, show, del)
	return cmd
}

// kindOf is a checkpoint's kind with its name, if any.
func kindOf(cp api.Checkpoint) string {
	if cp.Name != "" {
		return cp.Kind + " " + strconv.Quote(cp.Name)
	}
	return cp.Kind
}

func expiry(cp api.Checkpoint) string {
	switch {
	case cp.ExpiresAt.IsZero():
		return "never"
	case cp.Expired:
		return "expired " + cp.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return cp.ExpiresAt.UTC().Format(time.RFC3339)
}
