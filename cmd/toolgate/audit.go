package main

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/internal/auditexport"
)

// auditCmd: toolgate audit export [--since T] [--until T] > file.jsonl
func (a *app) auditCmd() *cobra.Command {
	var since, until string
	var all bool
	export := &cobra.Command{
		Use:   "export",
		Short: "Write the AUDIT stream as JSON Lines, for object storage or a SIEM",
		Example: `  toolgate audit export --since 720h > audit.jsonl
  toolgate audit export --since 2026-01-01T00:00:00Z --until 2026-02-01T00:00:00Z --all`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var o auditexport.Options
			var err error
			if o.Since, err = pointInTime(since); err != nil {
				return usageErr("--since: %v", err)
			}
			if o.Until, err = pointInTime(until); err != nil {
				return usageErr("--until: %v", err)
			}
			if !all {
				if o.Tenant, err = a.tenant(); err != nil {
					return err
				}
			}
			nc, err := a.conn.Connect()
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			n, err := auditexport.Export(cmd.Context(), js, a.stdout, o)
			fmt.Fprintf(a.stderr, "%d audit events exported\n", n)
			return err
		},
	}
	f := export.Flags()
	f.StringVar(&since, "since", "", "earliest event: an RFC 3339 time or a duration back from now (720h); default: the first")
	f.StringVar(&until, "until", "", "first time not exported: RFC 3339 or a duration back from now; default: now")
	f.BoolVar(&all, "all", false, "every tenant's events (operator), instead of one tenant's")
	cmd := &cobra.Command{Use: "audit", Short: "The audit trail", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() }}
	cmd.AddCommand(export)
	return cmd
}

// pointInTime reads an RFC 3339 time or a duration before now; "" is zero.
func pointInTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return time.Now().Add(-d), nil
	}
	return time.Parse(time.RFC3339, s)
}
