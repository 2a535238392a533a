package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/subjects"
)

// readFile reads the file a command argument names, or stdin for "-".
func (a *app) readFile(arg string) ([]byte, error) {
	if arg == "-" {
		return io.ReadAll(a.stdin)
	}
	return os.ReadFile(arg)
}

// readParams reads --params: a JSON object, @FILE, or - for stdin.
func (a *app) readParams(v string) (json.RawMessage, error) {
	var b []byte
	var err error
	switch {
	case v == "-":
		b, err = io.ReadAll(a.stdin)
	case strings.HasPrefix(v, "@"):
		b, err = os.ReadFile(v[1:])
	default:
		b = []byte(v)
	}
	if err != nil {
		return nil, usageErr("--params: %w", err)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil || obj == nil {
		return nil, usageErr("--params is not a JSON object: %s: %.200s", jsonProblem(b, err), strings.TrimSpace(string(b)))
	}
	return json.RawMessage(b), nil
}

// jsonProblem says where and why b is not a JSON object: the line, column
// and byte offset of a syntax error, or what kind of value it is instead.
func jsonProblem(b []byte, err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		line, col := lineCol(b, syn.Offset)
		return fmt.Sprintf("line %d, column %d (offset %d): %v", line, col, syn.Offset, syn)
	case errors.As(err, &typ):
		return fmt.Sprintf("it is a JSON %s, want an object such as {\"message\":\"hi\"}", typ.Value)
	case err != nil:
		return err.Error()
	}
	return "it is null, want an object such as {\"message\":\"hi\"}"
}

// lineCol is the 1-based line and column of byte offset off in b (a
// SyntaxError's Offset counts the bytes read, up to and with the bad one).
func lineCol(b []byte, off int64) (line, col int) {
	line, col = 1, 1
	for i := int64(0); i < off-1 && i < int64(len(b)); i++ {
		if b[i] == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return line, col
}

func (a *app) invokeCmd() *cobra.Command {
	var params, version, agent, session, id, idem, priority, resumeFrom string
	var wait, async, follow, dryRun bool
	var limit, waitFor time.Duration
	var docs api.DocumentContext
	cmd := &cobra.Command{
		Use:   "invoke TOOL",
		Short: "Call a tool; with --wait, wait for the result and show it",
		Long: `Call a tool. The capability token is --token ($TOOLGATE_TOKEN), else the
development token of a local serve --examples in --data; the tenant is
--tenant, else the token's. Without --wait the invocation id is printed at
once; with --wait progress is shown on stderr, a call parked for a human's
approval says so, and the exit status tells how the call ended.`,
		Example: `  toolgate invoke echo --params '{"message":"hi"}' --wait
  toolgate invoke fs.read_file --params @params.json --wait --json
  echo '{"ms":100}' | toolgate invoke sleep --params - --wait`,
		Args: exactArgs(1, "a tool id"),
	}
	f := cmd.Flags()
	f.StringVar(&params, "params", "{}", "parameters: a JSON object, @FILE, or - to read stdin")
	f.StringVar(&version, "version", "", "exact version or semver range (default: latest)")
	f.StringVar(&agent, "agent", "", "agent DID (default: the token's agent_did)")
	f.StringVar(&session, "session", "", "session id (default: the token's session_id)")
	f.StringVar(&id, "id", "", "invocation id (default: a new UUID)")
	f.StringVar(&idem, "idempotency-key", "", "repeat calls with this key return the first one's result")
	f.StringVar(&priority, "priority", "", "scheduling priority: high, normal or low")
	f.StringVar(&resumeFrom, "resume-from", "", "start from this checkpoint's state (toolgate checkpoints list)")
	f.BoolVar(&wait, "wait", false, "wait for the result and show it")
	f.BoolVar(&follow, "follow", false, "with --wait: when a hook hands the call to a retry or fallback, wait for that one too (each result is shown; the exit status is the last one's)")
	f.BoolVar(&async, "async", false, "ask for async mode: toolgate answers at once with pending and where to poll")
	f.BoolVar(&dryRun, "dry-run", false, "validate, authorize and route the call, then stop before the tool runs: what it would have done is in execution_metadata.dry_run_plan")
	f.StringArrayVar(&docs.DocumentRefs, "doc", nil, "a document to hand the tool: [source:]id[@version] (repeatable; docs/documents.md)")
	f.StringVar(&docs.Query, "doc-query", "", "hand the tool the documents the sources' search finds for this query")
	f.BoolVar(&docs.VersionPinning, "pin-docs", false, "hold the call to the document versions read at its start")
	f.DurationVar(&limit, "timeout", 0, "time limit of the call (whole seconds; narrows the tool's own limit)")
	f.DurationVar(&waitFor, "wait-timeout", 5*time.Minute, "how long --wait waits before giving up (exit 5)")
	_ = cmd.RegisterFlagCompletionFunc("priority", cobra.FixedCompletions([]string{subjects.PriorityHigh, "normal", "low"}, cobra.ShellCompDirectiveNoFileComp))
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		p, err := a.readParams(params)
		if err != nil {
			return err
		}
		tenant, err := a.tenant()
		if err != nil {
			return err
		}
		if err := a.checkAgentTenant(tenant); err != nil {
			return err
		}
		if agent == "" {
			c, _ := api.ReadTokenClaims(a.capToken())
			agent = cmp.Or(c.AgentDID, c.Subject, node.DevAgent)
		}
		if session == "" {
			// A token bound to a session grants calls of that session
			// only: name it, rather than have every call refused.
			var c token.Claims
			if _, _, err := jwt.NewParser().ParseUnverified(a.capToken(), &c); err == nil {
				session = c.SessionID
			}
		}
		req := api.Request{
			ToolID: args[0], ToolVersion: version, Parameters: p, CapabilityToken: a.capToken(),
			AgentContext: api.AgentContext{AgentDID: agent, TenantID: tenant, SessionID: session},
		}
		if async || idem != "" || priority != "" || dryRun {
			req.ExecutionOptions = &api.ExecutionOptions{AsyncMode: async, IdempotencyKey: idem, Priority: priority, DryRun: dryRun}
		}
		if len(docs.DocumentRefs) > 0 || docs.Query != "" || docs.VersionPinning {
			req.DocumentContext = &docs
		}
		if resumeFrom != "" {
			req.CheckpointConfig = &api.CheckpointConfig{ResumeFromCheckpointID: resumeFrom}
		}
		if limit > 0 {
			req.ResourceLimits = &api.ResourceLimits{TimeoutSeconds: int(math.Ceil(limit.Seconds()))}
		}
		c, closeFn, err := a.client()
		if err != nil {
			return err
		}
		defer closeFn()
		ctx := cmd.Context()
		invID, err := c.Invoke(ctx, req, client.InvokeOptions{ID: id})
		if err != nil {
			return err
		}
		if !wait {
			resp := api.Response{InvocationID: invID, Status: api.StatusPending,
				PollingInfo: &api.PollingInfo{ResultSubject: subjects.Result(tenant, req.AgentContext.AgentDID, invID), StatusSubject: subjects.TenantSvc(tenant, subjects.SvcStatus)}}
			return a.emit(resp, func(w io.Writer) error {
				fmt.Fprintf(w, "%s  invocation %s  tenant %s\n", a.status(api.StatusPending), invID, tenant)
				fmt.Fprintf(w, "follow it: toolgate status %s --tenant %s\n", invID, tenant)
				return nil
			})
		}
		for {
			resp, err := a.wait(ctx, c, tenant, invID, waitFor)
			if err != nil {
				return err
			}
			if err := a.emit(resp, func(w io.Writer) error { return a.renderResponse(w, resp) }); err != nil {
				return err
			}
			md := resp.ExecutionMetadata
			if !follow || md == nil || md.Hook == nil || md.Hook.HandedTo == "" {
				return shownStatus(resp.Status)
			}
			invID = md.Hook.HandedTo
		}
	}
	return cmd
}

// wait waits for the result of invocation id, reporting progress and a
// pending approval on stderr. When waitFor runs out it returns the record
// as it stands (a non-terminal status: exit 5).
func (a *app) wait(ctx context.Context, c *client.Client, tenant, id string, waitFor time.Duration) (api.Response, error) {
	wctx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	type result struct {
		r   api.Response
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := c.Wait(wctx, tenant, id)
		done <- result{r, err}
	}()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		select {
		case res := <-done:
			if res.err != nil && errors.Is(res.err, context.DeadlineExceeded) && ctx.Err() == nil {
				// Gave up waiting: say where the call stands.
				sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
				defer scancel()
				st := api.StatusPending
				if rec, err := c.Status(sctx, tenant, id); err == nil {
					st = rec.Status
				}
				fmt.Fprintf(a.stderr, "still %s after %s: toolgate status %s --tenant %s\n", st, waitFor, id, tenant)
				return api.Response{InvocationID: id, Status: st}, nil
			}
			if res.err != nil && ctx.Err() != nil {
				fmt.Fprintf(a.stderr, "stopped waiting; the call goes on: toolgate status %s (or toolgate cancel %s)\n", id, id)
			}
			return res.r, res.err
		case <-tick.C:
			sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
			rec, err := c.Status(sctx, tenant, id)
			scancel()
			if err != nil {
				continue // no record yet
			}
			var line string
			switch {
			case rec.Status == api.StatusPendingApproval:
				line = a.approvalHint(id, tenant)
			case rec.Progress != nil && rec.Status == api.StatusRunning:
				line = fmt.Sprintf("running: %.0f%% %s", rec.Progress.Percent, rec.Progress.Message)
			case rec.Status == api.StatusRunning:
				line = "running"
			case rec.Site != nil:
				line = siteLine(rec)
			}
			if line != "" && line != last {
				fmt.Fprintln(a.stderr, line)
				last = line
			}
		}
	}
}

func (a *app) statusCmd() *cobra.Command {
	var wait bool
	var waitFor time.Duration
	cmd := &cobra.Command{
		Use:   "status ID",
		Short: "Show an invocation's status, progress and result (exit status as for invoke --wait once it has ended)",
		Long: `Show an invocation's status, progress and result. With --wait, wait until it
ends as invoke --wait does (progress and a pending approval on stderr) and
show its result, with the same exit status: 0 success, 1 error, 4 denied,
5 timeout (or still going when --wait-timeout ran out), 6 cancelled.`,
		Example: `  ID=$(toolgate invoke sleep --params '{"ms":500}' --json | jq -r .invocation_id)
  toolgate status "$ID" --wait`,
		Args: exactArgs(1, "an invocation id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			tenant, c, closeFn, err := a.tenantClient()
			if err != nil {
				return err
			}
			defer closeFn()
			if wait {
				resp, err := a.wait(cmd.Context(), c, tenant, args[0], waitFor)
				if err != nil {
					return err
				}
				if err := a.emit(resp, func(w io.Writer) error { return a.renderResponse(w, resp) }); err != nil {
					return err
				}
				return shownStatus(resp.Status)
			}
			rec, err := c.Status(cmd.Context(), tenant, args[0])
			if err != nil {
				return err
			}
			if err := a.emit(rec, func(w io.Writer) error { return a.renderRecord(w, rec) }); err != nil {
				return err
			}
			if rec.Status.Terminal() {
				return shownStatus(rec.Status)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the call ends and show its result, exiting as invoke --wait does")
	cmd.Flags().DurationVar(&waitFor, "wait-timeout", 5*time.Minute, "how long --wait waits before giving up (exit 5)")
	return cmd
}

func (a *app) cancelCmd() *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "Stop an invocation: queued, running or waiting for approval",
		Args:  exactArgs(1, "an invocation id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			tenant, c, closeFn, err := a.tenantClient()
			if err != nil {
				return err
			}
			defer closeFn()
			rec, err := c.Cancel(cmd.Context(), tenant, args[0], reason)
			if err != nil {
				return err
			}
			return a.emit(rec, func(w io.Writer) error {
				if rec.Status.Terminal() {
					fmt.Fprintf(w, "%s already ended: %s\n", rec.InvocationID, a.status(rec.Status))
					return nil
				}
				fmt.Fprintf(w, "cancel requested for %s (was %s)\n", rec.InvocationID, a.status(rec.Status))
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the record")
	return cmd
}
