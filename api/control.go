package api

import "encoding/json"

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

// ListRequest filters tools.
type ListRequest struct {
	Category string `json:"category,omitempty"`
	Tag      string `json:"tag,omitempty"`
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
}

// ListResponse is the tool listing.
type ListResponse struct {
	Tools      []ToolSummary `json:"tools"`
	TotalCount int           `json:"total_count"`
}

// RegisterRequest registers a manifest.
type RegisterRequest struct {
	Manifest json.RawMessage `json:"manifest"`
	Replace  bool            `json:"replace,omitempty"`
}

// CancelRequest asks to stop an invocation.
type CancelRequest struct {
	TenantID     string `json:"tenant_id"`
	InvocationID string `json:"invocation_id"`
	RequestedBy  string `json:"requested_by,omitempty"`
	Reason       string `json:"reason,omitempty"`
}
