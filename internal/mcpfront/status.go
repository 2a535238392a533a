package mcpfront

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/api"
)

// StatusTool is the tool the front end serves next to toolgate's own: the
// status, or the result, of a call answered while it waits for approval.
const StatusTool = "toolgate_status"

// DefaultStatusWait is the longest one toolgate_status call waits for a
// result: well under the 60 s a client times a request out after by
// default.
const DefaultStatusWait = 20 * time.Second

// maxStatusWait bounds wait_seconds.
const maxStatusWait = 50 * time.Second

// pendingResult answers a call parked for approval: not an error, the
// call goes on; it says how to learn the outcome.
func pendingResult(id string) *mcp.CallToolResult {
	msg := fmt.Sprintf("This call waits for a person's approval (invocation %s); it is not done yet and has not been refused. "+
		"Call the tool %s with {\"invocation_id\": %q} to get its status or, once it is decided, its result. "+
		"Do not call the tool again: that would ask for approval a second time.", id, StatusTool, id)
	return &mcp.CallToolResult{
		Meta:              mcp.Meta{MetaInvocationID: id},
		Content:           []mcp.Content{&mcp.TextContent{Text: msg}},
		StructuredContent: map[string]any{"status": string(api.StatusPendingApproval), "invocation_id": id, "status_tool": StatusTool},
	}
}

func statusToolDef() *mcp.Tool {
	yes, no := true, false
	return &mcp.Tool{
		Name:  StatusTool,
		Title: "Status of a toolgate call",
		Description: "The status of a call that waits for a person's approval, or its result once it has ended. " +
			"Waits up to wait_seconds (default 20, at most 50) for the call to end before answering with its status.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{` +
			`"invocation_id":{"type":"string","description":"the invocation id the waiting call was answered with"},` +
			`"wait_seconds":{"type":"integer","minimum":0,"maximum":50}},"required":["invocation_id"],"additionalProperties":false}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, DestructiveHint: &no, OpenWorldHint: &yes, Title: "Status of a toolgate call"},
	}
}

// parkedCalls are the calls this front end answered while they waited for
// approval, and whose: toolgate_status answers only their caller (tenant
// and agent), whatever the front end's own connection may read.
type parkedCalls struct {
	mu    sync.Mutex
	calls map[string]parkedCall
}

type parkedCall struct {
	tenant, agent string
	at            time.Time
}

func (p *parkedCalls) add(id, tenant, agent string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.calls == nil {
		p.calls = map[string]parkedCall{}
	}
	p.calls[id] = parkedCall{tenant, agent, time.Now()}
}

func (p *parkedCalls) owns(id, tenant, agent string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.calls[id]
	return ok && c.tenant == tenant && c.agent == agent
}

// forget drops the calls parked longer ago than age: past MaxWait their
// approval has long expired.
func (p *parkedCalls) forget(age time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, c := range p.calls {
		if time.Since(c.at) > age {
			delete(p.calls, id)
		}
	}
}

// status is the toolgate_status handler: cancelling it (or the client's
// timeout) never touches the call it asks about.
func (s *session) status(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var in struct {
		ID   string `json:"invocation_id"`
		Wait *int   `json:"wait_seconds"`
	}
	if err := json.Unmarshal(req.Params.Arguments, &in); err != nil || in.ID == "" {
		return errorResult("", api.NewError(api.InvalidParameters, api.EParametersInvalid,
			"give the invocation_id the waiting call was answered with")), nil
	}
	c := s.claims
	if !s.f.parked.owns(in.ID, c.TenantID, c.AgentDID) {
		return errorResult("", api.NewError(api.ToolNotFound, api.EInvocationNotFound,
			"no call of yours with invocation id %s waits or waited for approval at this MCP endpoint", in.ID)), nil
	}
	wait := s.f.cfg.StatusWait
	if in.Wait != nil {
		wait = min(max(time.Duration(*in.Wait)*time.Second, 0), maxStatusWait)
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	t := time.NewTicker(s.f.cfg.StatusInterval)
	defer t.Stop()
	var rec api.Record
	for {
		// Each read has time of its own: wait_seconds 0 still reads once.
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := s.f.cfg.Bus.Status(rctx, c.TenantID, in.ID)
		rcancel()
		if err == nil {
			rec = r
		}
		if err == nil && rec.Status.Terminal() {
			resp := api.Response{InvocationID: in.ID, Status: rec.Status, Error: rec.Error}
			if rec.Response != nil {
				resp = *rec.Response
			}
			return toResult(resp), nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-deadline.C:
			if err != nil && rec.Status == "" {
				return nil, fmt.Errorf("reading the status of %s: %w", in.ID, err)
			}
			return &mcp.CallToolResult{
				Meta: mcp.Meta{MetaInvocationID: in.ID},
				Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(
					"Invocation %s has not ended: its status is %s. Call %s again later for its result.", in.ID, rec.Status, StatusTool)}},
				StructuredContent: map[string]any{"status": string(rec.Status), "invocation_id": in.ID},
			}, nil
		case <-t.C:
		}
	}
}
