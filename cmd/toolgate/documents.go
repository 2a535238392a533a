package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/internal/documents"
)

// docsCmd manages the document sources of the document bridge
// (docs/documents.md).
func (a *app) docsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "docs", Short: "Manage the document sources calls' document_context reads from", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() }}
	source := &cobra.Command{Use: "source", Short: "Declare, list and remove document sources (operators)", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() }}
	add := &cobra.Command{
		Use: "add FILE", Short: "Declare or replace a document source from its JSON document", Args: exactArgs(1, "a source document"),
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
			raw, err := c.AddDocSource(cmd.Context(), doc, whoami())
			if err != nil {
				return err
			}
			var s documents.Source
			if err := json.Unmarshal(raw, &s); err != nil {
				return err
			}
			return a.emit(s, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "declared document source %s (%s)\n", s.Name, sourceServer(s))
				return err
			})
		},
	}
	list := &cobra.Command{
		Use: "list", Short: "List the declared document sources", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			raws, err := c.DocSources(cmd.Context())
			if err != nil {
				return err
			}
			ss := make([]documents.Source, 0, len(raws))
			for _, raw := range raws {
				var s documents.Source
				if err := json.Unmarshal(raw, &s); err != nil {
					return err
				}
				ss = append(ss, s)
			}
			return a.emit(ss, func(w io.Writer) error {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tSERVER\tSEARCH\tTENANTS")
				for _, s := range ss {
					tenants := "all"
					if len(s.Tenants) > 0 {
						tenants = fmt.Sprint(s.Tenants)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Name, sourceServer(s), s.SearchTool, tenants)
				}
				return tw.Flush()
			})
		},
	}
	remove := &cobra.Command{
		Use: "remove NAME", Short: "Remove a document source", Args: exactArgs(1, "a source name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			return c.RemoveDocSource(cmd.Context(), args[0], whoami())
		},
	}
	source.AddCommand(add, list, remove)
	cmd.AddCommand(source)
	return cmd
}

func sourceServer(s documents.Source) string {
	if s.URL != "" {
		return s.URL
	}
	return "stdio " + s.Command[0]
}
