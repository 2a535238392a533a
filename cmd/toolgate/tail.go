package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
)

var errTailDone = errors.New("tail: count reached")

// auditLine is what tail shows of an audit event.
type auditLine struct {
	Time time.Time `json:"time"`
	Type string    `json:"type"`
	Data struct {
		TenantID     string     `json:"tenant_id"`
		InvocationID string     `json:"invocation_id"`
		ToolID       string     `json:"tool_id"`
		ToolVersion  string     `json:"tool_version"`
		Status       api.Status `json:"status"`
		Error        *api.Error `json:"error"`
	} `json:"data"`
}

// renderAudit formats one audit event on one line: time, tenant, event,
// tool, status, error code, invocation.
func (a *app) renderAudit(subject string, data []byte) string {
	var e auditLine
	_ = json.Unmarshal(data, &e)
	// audit.<tenant>.<event...>
	parts := strings.SplitN(subject, ".", 3)
	tenant, event := e.Data.TenantID, subject
	if len(parts) == 3 {
		tenant, event = parts[1], parts[2]
	}
	tool := e.Data.ToolID
	if tool != "" && e.Data.ToolVersion != "" {
		tool += "@" + e.Data.ToolVersion
	}
	code := "-"
	if e.Data.Error != nil {
		code = e.Data.Error.ECode
	}
	status := "-"
	if e.Data.Status != "" {
		status = a.status(e.Data.Status)
	}
	ts := "-"
	if !e.Time.IsZero() {
		ts = e.Time.UTC().Format("15:04:05.000")
	}
	return strings.TrimRight(fmt.Sprintf("%s  %-8s  %-20s  %-22s  %-17s  %-5s  %s", ts, tenant, event, or(tool, "-"), status, code, e.Data.InvocationID), " ")
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func (a *app) tailCmd() *cobra.Command {
	var all, everyTenant, follow bool
	var count int
	cmd := &cobra.Command{
		Use:   "tail",
		Short: "Follow the audit trail, one event a line (--json: the raw events)",
		Long: `Follow the audit trail of the tenant (--tenant, else the token's; --all-tenants
for every tenant), one event a line: time, tenant, event, tool, status, error
code, invocation. --json prints JSON Lines instead, one object a line:
{"subject": ..., "event": <the CloudEvent>}. --all prints the stored trail and
ends (--all --count N: its last N events); --all --follow goes on with the
new ones. Without --all it follows new events until interrupted. An agent
(only its token) reads its own tenant's: live through its audit subjects,
the stored trail (--all) a page at a time through the tenant's history
endpoint (toolgate audit history).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tenant := ""
			if !everyTenant {
				t, err := a.tenant()
				if err != nil {
					return err
				}
				tenant = t
			}
			if a.asAgent() && everyTenant {
				// Say so now rather than wait for the bus to refuse.
				return api.NewError(api.PermissionDenied, api.EBusNotPermitted,
					"an agent may not read other tenants' audit trails (--all-tenants): that takes operator credentials")
			}
			c, closeFn, err := a.client()
			if err != nil {
				return err
			}
			defer closeFn()
			n := 0
			show := func(subject string, data []byte) error {
				if err := a.writeAudit(subject, data); err != nil {
					return err
				}
				if n++; count > 0 && n >= count {
					return errTailDone
				}
				return nil
			}
			switch {
			case a.asAgent() && all:
				// Agents may create no consumer: the stored trail comes
				// a page at a time from the tenant's history endpoint.
				err = tailHistory(cmd.Context(), c, tenant, count, follow, show)
			case all && count > 0:
				// The last count events, like tail -n: it ends, also when
				// fewer exist.
				err = c.TailLast(cmd.Context(), tenant, count, a.writeAudit)
			case all && !follow:
				// The stored trail, then the end: what a first look wants.
				err = c.TailLast(cmd.Context(), tenant, math.MaxInt, a.writeAudit)
			case a.asAgent():
				err = c.TailLive(cmd.Context(), tenant, show)
			default:
				err = c.Tail(cmd.Context(), tenant, all, show)
			}
			if errors.Is(err, errTailDone) {
				return nil
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "print the stored events and end (with --count N, the last N; with --follow, go on with new ones)")
	cmd.Flags().BoolVar(&follow, "follow", false, "with --all: after the stored events, follow new ones until interrupted")
	cmd.Flags().BoolVar(&everyTenant, "all-tenants", false, "every tenant's events")
	cmd.Flags().IntVar(&count, "count", 0, "stop after this many events (0: follow until interrupted)")
	return cmd
}

// historyPoll is how often an agent's `tail --all` asks for events stored
// after the last page.
const historyPoll = 500 * time.Millisecond

// tailHistory is tail --all through the tenant's audit history endpoint:
// with count > 0 the last count stored events, else every stored event and,
// with follow, then each new one as it is stored, until ctx ends or show
// fails.
func tailHistory(ctx context.Context, c *client.Client, tenant string, count int, follow bool, show func(string, []byte) error) error {
	var r api.AuditHistoryRequest
	var last []api.AuditEntry
	for {
		p, err := c.AuditHistory(ctx, tenant, r)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		r.Cursor = p.NextCursor
		if count > 0 {
			last = append(last, p.Events...)
			if len(last) > count {
				last = last[len(last)-count:]
			}
			if !p.More {
				for _, e := range last {
					if err := show(e.Subject, e.Event); err != nil {
						return err
					}
				}
				return nil
			}
			continue
		}
		for _, e := range p.Events {
			if err := show(e.Subject, e.Event); err != nil {
				return err
			}
		}
		if !p.More && !follow {
			return nil
		}
		if !p.More {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(historyPoll):
			}
		}
	}
}

// writeAudit prints one audit event: a line for people, or a JSON Lines
// object {"subject", "event"} with --json.
func (a *app) writeAudit(subject string, data []byte) error {
	if !a.json {
		_, err := io.WriteString(a.stdout, a.renderAudit(subject, data)+"\n")
		return err
	}
	line, err := json.Marshal(struct {
		Subject string          `json:"subject"`
		Event   json.RawMessage `json:"event"`
	}{subject, auditEvent(data)})
	if err != nil {
		return err
	}
	_, err = a.stdout.Write(append(line, '\n'))
	return err
}

// auditEvent is data as JSON: the event itself, or as a string when it is
// not JSON (an event nothing could read is audited as it came).
func auditEvent(data []byte) json.RawMessage {
	if json.Valid(data) {
		return data
	}
	b, _ := json.Marshal(string(data))
	return b
}
