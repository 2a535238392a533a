package main

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/api"
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
	cmd.AddCommand(export, a.auditHistoryCmd())
	return cmd
}

// auditHistoryCmd: toolgate audit history [--since T] [--cursor C] [--all]
func (a *app) auditHistoryCmd() *cobra.Command {
	var since, cursor string
	var size int
	var all bool
	cmd := &cobra.Command{
		Use:   "history",
		Short: "Print a page of the tenant's stored audit events (an agent's token is enough)",
		Long: `Print a page of the tenant's stored audit events, oldest first, one a line as
tail prints them (--json: the page, {"events":[{"subject","time","event"}],
"next_cursor","more"}). It asks the tenant's own endpoint
tool.svc.<tenant>.audit.history, which an agent may call with only its token;
another tenant's is refused. The line on stderr gives the cursor of the next
page; given again later, that cursor answers only events stored since.`,
		Example: `  toolgate audit history --since 1h
  toolgate audit history --cursor 42 --page-size 200
  toolgate audit history --all --json | jq '.events | length'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r := api.AuditHistoryRequest{Cursor: cursor, PageSize: size}
			if since != "" {
				t, err := pointInTime(since)
				if err != nil {
					return usageErr("--since: %v", err)
				}
				r.Since = &t
			}
			tenant, err := a.tenant()
			if err != nil {
				return err
			}
			c, closeFn, err := a.client()
			if err != nil {
				return err
			}
			defer closeFn()
			page := api.AuditHistoryResponse{Events: []api.AuditEntry{}}
			for {
				p, err := c.AuditHistory(cmd.Context(), tenant, r)
				if err != nil {
					return err
				}
				page.Events = append(page.Events, p.Events...)
				page.NextCursor, page.More = p.NextCursor, p.More
				if !all || !p.More {
					break
				}
				r.Cursor, r.Since = p.NextCursor, nil
			}
			if a.json {
				return a.printJSON(page)
			}
			for _, e := range page.Events {
				if err := a.writeAudit(e.Subject, e.Event); err != nil {
					return err
				}
			}
			what := "no more stored; later events"
			if page.More {
				what = "next page"
			}
			fmt.Fprintf(a.stderr, "%d events; %s: --cursor %s\n", len(page.Events), what, page.NextCursor)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&since, "since", "", "first event at or after this time: RFC 3339 or a duration back from now (1h); default: the first stored")
	f.StringVar(&cursor, "cursor", "", "start where a previous page's next cursor says (overrides --since)")
	f.IntVar(&size, "page-size", 0, "events a page, at most 200 (default 50)")
	f.BoolVar(&all, "all", false, "every page up to the last event stored")
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
