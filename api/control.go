package api

import (
	"encoding/json"
	"time"
)

// StatusRequest asks for an invocation's status.
type StatusRequest struct {
	TenantID     string `json:"tenant_id"`
	InvocationID string `json:"invocation_id"`
}

// ToolRequest names a tool and optionally a version or range.
type ToolRequest struct {
	ToolID  string `json:"tool_id"`
	Version string `json:"version,omitempty"`
}

// ListRequest filters, searches and pages tools (tools.list). Every filter given must hold.
// With Query or Capabilities the tools are ranked (ToolSummary.Score),
// else sorted by id.
type ListRequest struct {
	Category string `json:"category,omitempty"`
	Tag      string `json:"tag,omitempty"`
	// Query is searched for, word by word, in ids, names, descriptions,
	// tags and capabilities; a tool matching none of its words is left out.
	Query string `json:"query,omitempty"`
	// Capabilities are capability tags the tool should have (in
	// capabilities or tags); a tool with none of them is left out.
	Capabilities []string `json:"capabilities,omitempty"`
	// RiskLevelMax leaves out tools riskier than low, medium, high or critical.
	RiskLevelMax string `json:"risk_level_max,omitempty"`
	// ExcludeSideEffects leaves out tools declaring one of these side
	// effects or a sub-tag of one ("network" excludes "network.http").
	ExcludeSideEffects []string `json:"exclude_side_effects,omitempty"`
	// SourceTypes keeps tools of these kinds (builtin, http, cli, mcp, model).
	SourceTypes []string `json:"source_types,omitempty"`
	// EnabledOnly leaves out tools whose latest version is deprecated.
	EnabledOnly bool `json:"enabled_only,omitempty"`
	// All lists also the tools no version of which serves (every one
	// removed or sunset), each by its highest version.
	All bool `json:"all,omitempty"`
	// CapabilityToken keeps only the tools this token may call (its
	// tool patterns and excluded side effects); it must verify.
	CapabilityToken string `json:"capability_token,omitempty"`
	// PageSize is at most 200; default 50. Cursor is a previous answer's
	// next_cursor for the same request.
	PageSize int    `json:"page_size,omitempty"`
	Cursor   string `json:"cursor,omitempty"`
}

// ToolSummary is one entry of a tool listing.
type ToolSummary struct {
	ToolID           string   `json:"tool_id"`
	ToolName         string   `json:"tool_name"`
	Description      string   `json:"description"`
	Category         string   `json:"category,omitempty"`
	Kind             string   `json:"kind"`
	Versions         []string `json:"versions"`
	LatestVersion    string   `json:"latest_version"`
	Tags             []string `json:"tags,omitempty"`
	RiskLevel        string   `json:"risk_level,omitempty"`
	RequiresApproval bool     `json:"requires_approval"`
	Capabilities     []string `json:"capabilities,omitempty"`
	SideEffects      []string `json:"side_effects,omitempty"`
	State            string   `json:"state,omitempty"`
	// Score and Terms rank a search: Score is
	// 0.4·match + 0.2·usage + 0.15·latency + 0.15·cost + 0.1·safety.
	Score float64     `json:"score,omitempty"`
	Terms *ScoreTerms `json:"terms,omitempty"`
}

// ScoreTerms are the ranking terms of one tool, each in [0, 1].
type ScoreTerms struct {
	Match   float64 `json:"match"`
	Usage   float64 `json:"usage"`
	Latency float64 `json:"latency"`
	Cost    float64 `json:"cost"`
	Safety  float64 `json:"safety"`
}

// ListResponse is the tool listing: one page of the tools that passed the
// filters, TotalCount of them in all; NextCursor fetches the next page.
type ListResponse struct {
	Tools      []ToolSummary `json:"tools"`
	TotalCount int           `json:"total_count"`
	PageSize   int           `json:"page_size,omitempty"`
	NextCursor string        `json:"next_cursor,omitempty"`
}

// RegisterRequest registers a manifest.
type RegisterRequest struct {
	Manifest json.RawMessage `json:"manifest"`
	Replace  bool            `json:"replace,omitempty"`
	// AcceptDigest accepts the change held for an imported tool's
	// version: the manifest, sent with replace, is stored if the change
	// held has this digest and so does the manifest (E3867, E3868).
	AcceptDigest string `json:"accept_digest,omitempty"`
}

// PendingChange is a held change of an imported tool, as tools.get shows
// it beside the served manifest (member pending_change).
type PendingChange struct {
	PinnedDigest string          `json:"pinned_digest"`
	Digest       string          `json:"digest"`
	By           string          `json:"by,omitempty"`
	At           time.Time       `json:"at"`
	Manifest     json.RawMessage `json:"manifest"`
}

// CancelRequest asks to stop an invocation.
type CancelRequest struct {
	TenantID     string `json:"tenant_id"`
	InvocationID string `json:"invocation_id"`
	RequestedBy  string `json:"requested_by,omitempty"`
	Reason       string `json:"reason,omitempty"`
}

// AuditHistoryRequest asks for a page of one tenant's stored audit events,
// oldest first (tool.svc.<tenant>.audit.history). Cursor is a previous
// answer's next_cursor; without one the page starts at the first event at
// or after Since, or at the first stored. PageSize is at most 200; default 50.
type AuditHistoryRequest struct {
	TenantID string     `json:"tenant_id,omitempty"`
	Since    *time.Time `json:"since,omitempty"`
	Cursor   string     `json:"cursor,omitempty"`
	PageSize int        `json:"page_size,omitempty"`
}

// AuditHistoryResponse is a page of audit events. NextCursor is where the
// next page starts, also when this one reached the end: asked again later,
// it answers the events stored since. More says whether stored events
// remain beyond this page.
type AuditHistoryResponse struct {
	Events     []AuditEntry `json:"events"`
	NextCursor string       `json:"next_cursor"`
	More       bool         `json:"more"`
}

// AuditEntry is one stored audit event: its subject, when the stream stored
// it, and the CloudEvent (a JSON string when it was not JSON).
type AuditEntry struct {
	Subject string          `json:"subject"`
	Time    time.Time       `json:"time"`
	Event   json.RawMessage `json:"event"`
}
