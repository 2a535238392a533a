package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/toolgate/toolgate/api"
)

func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// emit prints v as JSON under --json, else calls human.
func (a *app) emit(v any, human func(w io.Writer) error) error {
	if a.json {
		return a.printJSON(v)
	}
	return human(a.stdout)
}

// table writes aligned columns.
func table(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

const (
	green  = "\x1b[32m"
	red    = "\x1b[31m"
	yellow = "\x1b[33m"
	reset  = "\x1b[0m"
)

// status renders s, coloured on a terminal.
func (a *app) status(s api.Status) string {
	if !a.color {
		return string(s)
	}
	c := yellow
	switch s {
	case api.StatusSuccess:
		c = green
	case api.StatusError, api.StatusPermissionDenied, api.StatusTimeout, api.StatusCancelled:
		c = red
	}
	return c + string(s) + reset
}

// indentJSON pretty-prints a JSON document, indented by prefix.
func indentJSON(raw json.RawMessage, prefix string) string {
	var b bytes.Buffer
	if err := json.Indent(&b, raw, prefix, "  "); err != nil {
		return prefix + string(raw)
	}
	return prefix + b.String()
}

func errorLine(e *api.Error) string {
	s := fmt.Sprintf("%s %s: %s", e.ECode, e.Code, e.Message)
	for _, f := range e.Fields {
		s += fmt.Sprintf("\n  %s: %s", f.Location, f.Message)
	}
	return s
}

// renderResponse writes a result for people: a status line, then the
// error or the result document.
func (a *app) renderResponse(w io.Writer, r api.Response) error {
	head := []string{a.status(r.Status)}
	if md := r.ExecutionMetadata; md != nil {
		if md.ToolID != "" && md.ToolVersion != "" {
			head = append(head, md.ToolID+"@"+md.ToolVersion)
		} else if md.ToolID != "" {
			head = append(head, md.ToolID)
		}
		head = append(head, fmt.Sprintf("%dms", md.DurationMS))
	}
	head = append(head, "invocation "+r.InvocationID)
	fmt.Fprintln(w, strings.Join(head, "  "))
	if md := r.ExecutionMetadata; md != nil {
		for _, warn := range md.Warnings {
			fmt.Fprintln(w, "warning:", warn)
		}
		if md.ReplayedFrom != "" {
			fmt.Fprintln(w, "replayed from", md.ReplayedFrom)
		}
	}
	if r.Error != nil {
		fmt.Fprintln(w, "error:", errorLine(r.Error))
	}
	if len(r.Result) > 0 {
		fmt.Fprintln(w, indentJSON(r.Result, ""))
	}
	if md := r.ExecutionMetadata; md != nil && md.Hook != nil {
		renderHook(w, md.Hook)
	}
	return nil
}

// renderHook writes what a hook decided about an invocation.
func renderHook(w io.Writer, h *api.HookOutcome) {
	if h.Parent != "" {
		fmt.Fprintln(w, "started by a hook of", h.Parent)
	}
	if h.Action != "" {
		line := fmt.Sprintf("hook %s (%s, on %s): %s", h.Hook, h.Source, cmp.Or(h.Trigger, "success"), h.Action)
		if h.HandedTo != "" {
			line += ", handed to " + h.HandedTo
		}
		if h.SessionAborted {
			line += ", session ended"
		}
		fmt.Fprintln(w, line)
	}
	for _, e := range h.ConditionErrors {
		fmt.Fprintln(w, "hook condition failed (taken as false):", e)
	}
}

// renderRecord writes an invocation's record for people.
func (a *app) renderRecord(w io.Writer, rec api.Record) error {
	tool := rec.ToolID
	if rec.ToolVersion != "" {
		tool += "@" + rec.ToolVersion
	}
	fmt.Fprintf(w, "%s  %s  %s  tenant %s  updated %s\n", a.status(rec.Status), tool, rec.InvocationID, rec.Tenant,
		rec.UpdatedAt.UTC().Format(time.RFC3339))
	if rec.CancelRequested && !rec.Status.Terminal() {
		fmt.Fprintln(w, "cancel requested")
	}
	if line := siteLine(rec); line != "" {
		fmt.Fprintln(w, line)
	}
	if p := rec.Progress; p != nil && !rec.Status.Terminal() {
		fmt.Fprintf(w, "progress: %.0f%% %s\n", p.Percent, p.Message)
	}
	if cp := rec.Checkpoint; cp != nil && cp.ID != "" {
		fmt.Fprintf(w, "last checkpoint: %s (%s, %s)\n", cp.ID, cp.Kind, cp.CreatedAt.UTC().Format(time.RFC3339))
	}
	if rec.Status == api.StatusPendingApproval {
		fmt.Fprintln(w, a.approvalHint(rec.InvocationID, rec.Tenant))
	}
	if rec.Error != nil {
		fmt.Fprintln(w, "error:", errorLine(rec.Error))
	} else if rec.Response != nil && rec.Response.Error != nil {
		fmt.Fprintln(w, "error:", errorLine(rec.Response.Error))
	}
	if rec.Response != nil && len(rec.Response.Result) > 0 {
		fmt.Fprintln(w, indentJSON(rec.Response.Result, ""))
	}
	return nil
}

// siteLine says which site a call of a site's tool runs at and, while it
// waits, why: "pending: waiting for site lab-eu, link down since …".
func siteLine(rec api.Record) string {
	s := rec.Site
	if s == nil || rec.Status.Terminal() {
		return ""
	}
	if rec.Status != api.StatusPending {
		return fmt.Sprintf("%s at site %s", rec.Status, s.Site)
	}
	switch {
	case s.Link == "up":
		return fmt.Sprintf("pending: waiting for site %s (link up, %d calls queued for it)", s.Site, s.Queued)
	case s.Link == "":
		return fmt.Sprintf("pending: waiting for site %s", s.Site)
	case s.LastContact != nil:
		return fmt.Sprintf("pending: waiting for site %s, link down since %s", s.Site, s.LastContact.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("pending: waiting for site %s, link down (never connected)", s.Site)
}

// approvalHint says what a call waiting for a human waits for: to an
// operator, the command that decides it; to an agent, which cannot decide
// its own calls, only that a human will.
func (a *app) approvalHint(id, tenant string) string {
	if a.asAgent() {
		return "pending approval: waiting for a human to approve or deny it; it runs once approved (follow it: toolgate status " + id + ")"
	}
	return fmt.Sprintf("pending approval: toolgate approve %s --tenant %s (or deny)", id, tenant)
}
