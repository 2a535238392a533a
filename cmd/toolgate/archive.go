package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/archivestore"
	"github.com/toolgate/toolgate/internal/auditarchive"
)

// archiveFlagHelp describes --archive wherever it is taken.
const archiveFlagHelp = "the archive: nats://[BUCKET] (default: the bus's toolgate_audit_archive bucket) or s3://BUCKET/PREFIX (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... or ?endpoint=)"

// jetStream connects with the command's credentials; done closes the
// connection.
func (a *app) jetStream() (jetstream.JetStream, func(), error) {
	nc, err := a.conn.Connect()
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return js, nc.Close, nil
}

// archiveStore opens --archive on the bus.
func (a *app) archiveStore(url string) (archivestore.Store, func(), error) {
	js, done, err := a.jetStream()
	if err != nil {
		return nil, nil, err
	}
	s, err := archivestore.Open(js, url)
	if err != nil {
		done()
		return nil, nil, usageErr("--archive: %v", err)
	}
	return s, done, nil
}

// auditArchiveCmd: toolgate audit archive [--archive URL]
func (a *app) auditArchiveCmd() *cobra.Command {
	var url, key string
	var maxEvents int
	cmd := &cobra.Command{
		Use:   "archive",
		Short: "Copy the closed ranges of AUDIT not archived yet to the archive, and read each back",
		Long: `Copy every range of AUDIT that ends at a signed checkpoint and is not archived
yet, with its checkpoints, to the archive: one object a range, an export as
audit verify --file reads it, named AUDIT-<stream created>-<first>-<last>.jsonl.
Each object is read back and checked (size, digest, every checkpoint's root)
before the next; the run ends with a head, HEAD-<stream created>-<last>.json,
naming its last object with that range's signed checkpoint, which audit verify
--archive holds the objects to. Nothing is removed from AUDIT (docs/audit.md).
serve does the same every --archive-every.`,
		Example: `  toolgate audit archive
  toolgate audit archive --archive s3://audit-cold/toolgate`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pub, err := a.chainKey(key)
			if err != nil {
				return err
			}
			js, done, err := a.jetStream()
			if err != nil {
				return err
			}
			defer done()
			store, err := archivestore.Open(js, url)
			if err != nil {
				return usageErr("--archive: %v", err)
			}
			got, err := (&auditarchive.Archiver{JS: js, Store: store, Key: pub, MaxEvents: maxEvents}).Once(cmd.Context())
			for _, r := range got {
				fmt.Fprintf(a.stdout, "%s\t%d bytes\n", r.Name, r.Size)
			}
			fmt.Fprintf(a.stderr, "%d ranges archived to %s\n", len(got), store)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&url, "archive", "", archiveFlagHelp)
	f.StringVar(&key, "key", "", "the public audit chain key (audit-chain.pub); default: the data directory's")
	f.IntVar(&maxEvents, "max-events", auditarchive.DefaultMaxEvents, "events an object holds at most")
	return cmd
}

// auditRestoreCmd: toolgate audit restore RANGE [--archive URL] [-o FILE]
func (a *app) auditRestoreCmd() *cobra.Command {
	var url, out string
	cmd := &cobra.Command{
		Use:   "restore RANGE",
		Short: "Read one archived range back, as an export for audit verify --file",
		Long: `Read one archived range back: RANGE is an object's name, FIRST-LAST, or one
AUDIT sequence (the object holding it). It is written to --output (default
stdout) as stored: an export that audit verify --file checks offline.`,
		Example: `  toolgate audit restore 1-1000 -o range.jsonl
  toolgate audit verify --file range.jsonl`,
		Args: exactArgs(1, "RANGE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			store, done, err := a.archiveStore(url)
			if err != nil {
				return err
			}
			defer done()
			r, err := auditarchive.Find(cmd.Context(), store, args[0])
			if err != nil {
				if errors.Is(err, archivestore.ErrNotFound) {
					return &codeError{code: exitError, err: err}
				}
				return err
			}
			data, err := store.Get(cmd.Context(), r.Name)
			if err != nil {
				return err
			}
			var w io.Writer = a.stdout
			if out != "" && out != "-" {
				if err := os.WriteFile(out, data, 0o600); err != nil {
					return err
				}
				w = io.Discard
			}
			if _, err := w.Write(data); err != nil {
				return err
			}
			fmt.Fprintf(a.stderr, "%s: sequences %d..%d, %d bytes\n", r.Name, r.First, r.Last, len(data))
			return nil
		},
	}
	cmd.Flags().StringVar(&url, "archive", "", archiveFlagHelp)
	cmd.Flags().StringVarP(&out, "output", "o", "", "write to this file instead of stdout")
	return cmd
}

// verifyArchive is audit verify --archive.
func (a *app) verifyArchive(cmd *cobra.Command, url, key string) error {
	pub, err := a.chainKey(key)
	if err != nil {
		return err
	}
	store, done, err := a.archiveStore(url)
	if err != nil {
		return err
	}
	defer done()
	r, err := auditarchive.VerifyArchive(cmd.Context(), store, pub)
	if err != nil {
		return err
	}
	err = a.emit(r, func(w io.Writer) error {
		for _, f := range r.Findings {
			fmt.Fprintln(w, f.String())
		}
		state := "intact"
		if !r.Intact() {
			state = fmt.Sprintf("NOT intact: %d findings", len(r.Findings))
		}
		covered := ""
		if n := len(r.Ranges); n > 0 {
			covered = fmt.Sprintf(" (seq %d..%d)", r.Ranges[0].First, r.Ranges[n-1].Last)
		}
		_, err := fmt.Fprintf(w, "archive %s %s: %d objects, %d checkpoints, %d events checked%s\n", store, state, r.Objects, r.Checkpoints, r.Events, covered)
		return err
	})
	if err == nil && !r.Intact() {
		return &codeError{code: exitError, err: errors.New("the audit archive is not intact"), shown: true}
	}
	return err
}
