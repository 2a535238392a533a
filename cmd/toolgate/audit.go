package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/internal/auditexport"
	"github.com/toolgate/toolgate/internal/busauth"
)

// auditCmd: toolgate audit export [--since T] [--until T] > file.jsonl
func (a *app) auditCmd() *cobra.Command {
	var since, until string
	var all, chain bool
	export := &cobra.Command{
		Use:   "export",
		Short: "Write the AUDIT stream as JSON Lines, for object storage or a SIEM",
		Example: `  toolgate audit export --since 720h > audit.jsonl
  toolgate audit export --since 2026-01-01T00:00:00Z --until 2026-02-01T00:00:00Z --all
  toolgate audit export --all --chain > audit.jsonl`,
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
			js, done, err := a.jetStream()
			if err != nil {
				return err
			}
			defer done()
			if chain {
				return a.chainExport(cmd.Context(), js, o)
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
	f.BoolVar(&chain, "chain", false, "write the checkpoints and each event's inclusion proof too, for audit verify --file (docs/audit.md)")
	cmd := &cobra.Command{Use: "audit", Short: "The audit trail", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() }}
	cmd.AddCommand(export, a.auditHistoryCmd(), a.auditVerifyCmd(), a.auditProveCmd(), a.auditArchiveCmd(), a.auditRestoreCmd())
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

// chainExport writes the verifiable export (auditchain.Export).
func (a *app) chainExport(ctx context.Context, js jetstream.JetStream, o auditexport.Options) error {
	src := auditchain.Bus{JS: js}
	from, to, err := seqWindow(ctx, src, o.Since, o.Until)
	if err != nil {
		return err
	}
	n, err := auditchain.Export(ctx, src, a.stdout, auditchain.ExportOptions{From: from, To: to, Tenant: o.Tenant})
	fmt.Fprintf(a.stderr, "%d audit events exported with their checkpoints\n", n)
	return err
}

// seqWindow turns a time window into AUDIT sequences (0: no bound); an
// empty window is one no sequence falls in.
func seqWindow(ctx context.Context, src auditchain.Bus, since, until time.Time) (from, to uint64, err error) {
	if !since.IsZero() {
		if from, err = src.FirstAt(ctx, since); err != nil {
			return 0, 0, err
		}
		if from == 0 {
			return math.MaxUint64, math.MaxUint64, nil
		}
	}
	if !until.IsZero() {
		next, err := src.FirstAt(ctx, until)
		if err != nil {
			return 0, 0, err
		}
		switch next {
		case 0: // nothing stored since: no bound
		case 1:
			return math.MaxUint64, math.MaxUint64, nil
		default:
			to = next - 1
		}
	}
	return from, to, nil
}

// chainKey reads the public audit chain key: --key, or the data directory's.
func (a *app) chainKey(path string) (ed25519.PublicKey, error) {
	if path == "" {
		k, err := busauth.LoadAuditChainPublicKey(a.data)
		if err != nil {
			return nil, usageErr("--key: no audit chain key given, and none in %s: %v", filepath.Join(a.data, busauth.DirName), err)
		}
		return k, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, usageErr("--key: %v", err)
	}
	k, err := busauth.ParseAuditChainPublicKey(b)
	if err != nil {
		return nil, usageErr("--key %s: %v", path, err)
	}
	return k, nil
}

// auditVerifyCmd: toolgate audit verify [--since --until --tenant] | --file F --key K
func (a *app) auditVerifyCmd() *cobra.Command {
	var since, until, tenant, file, key, archive string
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Check the audit trail against its signed checkpoints; exit 0 only when intact",
		Long: `Check the AUDIT stream (or an export of it) against the signed checkpoints the
audit stage writes, and name, by sequence and event id, every event altered,
deleted, inserted or moved, or written by no audit process, a stream created
again, a checkpoint forged or missing, and the events after the last
checkpoint not yet covered.
The exit status is 0 only when nothing is wrong (docs/audit.md).`,
		Example: `  toolgate audit verify
  toolgate audit verify --since 24h --tenant acme
  toolgate audit verify --file audit.jsonl --key audit-chain.pub
  toolgate audit verify --archive s3://audit-cold/toolgate`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("archive") {
				if file != "" || since != "" || until != "" || tenant != "" {
					return usageErr("--archive checks the whole archive; --file, --since, --until and --tenant do not apply")
				}
				return a.verifyArchive(cmd, archive, key)
			}
			pub, err := a.chainKey(key)
			if err != nil {
				return err
			}
			o := auditchain.Options{Key: pub, Tenant: tenant}
			var src auditchain.Source
			if file != "" {
				if since != "" || until != "" {
					return usageErr("--since and --until select from the bus; an export holds the window it was written for")
				}
				fh, err := os.Open(file)
				if err != nil {
					return err
				}
				defer fh.Close()
				f, err := auditchain.ReadFile(fh)
				if err != nil {
					return fmt.Errorf("%s: %w", file, err)
				}
				src = f
			} else {
				s, err := pointInTime(since)
				if err != nil {
					return usageErr("--since: %v", err)
				}
				u, err := pointInTime(until)
				if err != nil {
					return usageErr("--until: %v", err)
				}
				js, done, err := a.jetStream()
				if err != nil {
					return err
				}
				defer done()
				bus := auditchain.Bus{JS: js}
				if o.From, o.To, err = seqWindow(cmd.Context(), bus, s, u); err != nil {
					return err
				}
				o.Since = s
				src = bus
			}
			r, err := auditchain.Verify(cmd.Context(), src, o)
			if err != nil {
				return err
			}
			err = a.emit(r, func(w io.Writer) error {
				for _, f := range r.Findings {
					fmt.Fprintln(w, f.String())
				}
				for _, f := range r.Notes {
					fmt.Fprintln(w, "note: "+f.String())
				}
				for _, f := range r.Unattested {
					fmt.Fprintln(w, "note: "+f.String())
				}
				state := "intact"
				if !r.Intact() {
					state = fmt.Sprintf("NOT intact: %d findings", len(r.Findings))
				}
				covered := ""
				if r.CoveredLast != 0 {
					covered = fmt.Sprintf(" (seq %d..%d)", r.CoveredFirst, r.CoveredLast)
				}
				_, err := fmt.Fprintf(w, "%s: %d checkpoints, %d events checked%s\n", state, r.Checkpoints, r.Events, covered)
				return err
			})
			if err == nil && !r.Intact() {
				return &codeError{code: exitError, err: errors.New("the audit trail is not intact"), shown: true}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&since, "since", "", "check the checkpoints of events stored since: RFC 3339 or a duration back from now; default: all")
	f.StringVar(&until, "until", "", "first time not checked: RFC 3339 or a duration back from now; default: now")
	f.StringVar(&tenant, "tenant", "", "name only this tenant's events (the chain's own findings always)")
	f.StringVar(&file, "file", "", "check an export (toolgate audit export --chain) instead of the bus")
	f.StringVar(&archive, "archive", "", "check the archive instead of the bus (nats:// for the default bucket): each range, and the chain across them")
	f.StringVar(&key, "key", "", "the public audit chain key (audit-chain.pub); default: the data directory's")
	return cmd
}

// auditProveCmd: toolgate audit prove EVENT_ID
func (a *app) auditProveCmd() *cobra.Command {
	var key string
	cmd := &cobra.Command{
		Use:     "prove EVENT_ID",
		Short:   "Print an RFC 9162 inclusion proof of one audit event in its signed checkpoint",
		Example: `  toolgate audit prove inv-123:tool.succeeded > proof.json`,
		Args:    exactArgs(1, "EVENT_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			pub, err := a.chainKey(key)
			if err != nil {
				return err
			}
			js, done, err := a.jetStream()
			if err != nil {
				return err
			}
			defer done()
			p, err := auditchain.Prove(cmd.Context(), auditchain.Bus{JS: js}, args[0], pub)
			if err != nil {
				return err
			}
			return a.printJSON(p)
		},
	}
	cmd.Flags().StringVar(&key, "key", "", "the public audit chain key (audit-chain.pub); default: the data directory's")
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
