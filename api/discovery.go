package api

import "time"

// ToolStats is what the audit stage has seen of one tool's calls: every
// invocation that reached the tool, merged from each audit process's share.
type ToolStats struct {
	ToolID      string  `json:"tool_id"`
	Calls       int64   `json:"calls"`
	Successes   int64   `json:"successes"`
	SuccessRate float64 `json:"success_rate"`
	// Latency percentiles in milliseconds: the upper bound of the
	// histogram bucket the percentile falls in.
	P50MS   float64 `json:"p50_ms"`
	P95MS   float64 `json:"p95_ms"`
	P99MS   float64 `json:"p99_ms"`
	MeanMS  float64 `json:"mean_ms"`
	Cost    float64 `json:"cost"`
	AvgCost float64 `json:"avg_cost"`
	// LastCall is when a shard last recorded a call.
	LastCall time.Time `json:"last_call,omitzero"`
}

// StatsRequest asks for the usage statistics of one tool, or of all.
type StatsRequest struct {
	ToolID string `json:"tool_id,omitempty"`
}

// StatsResponse lists usage statistics, by tool id.
type StatsResponse struct {
	Tools []ToolStats `json:"tools"`
}

// CapabilityRequest is what an agent sends when it needs a capability:
// a named capability with input and output contracts, the
// constraints the tool must run under, and why. Decoding refuses unknown
// fields; absent constraints take the most restrictive defaults.
type CapabilityRequest struct {
	Kind           string                `json:"kind"`
	Capability     string                `json:"capability"`
	InputContract  string                `json:"input_contract"`
	OutputContract string                `json:"output_contract"`
	Constraints    CapabilityConstraints `json:"constraints"`
	Reason         string                `json:"reason"`
	// RequestID names the request for its report; toolgate chooses one
	// when absent.
	RequestID string `json:"request_id,omitempty"`
	// CapabilityToken is the agent's own token, the parent of a grant.
	CapabilityToken string `json:"capability_token,omitempty"`
	// SessionID binds the grant to one session.
	SessionID string `json:"session_id,omitempty"`
}

// CapabilityConstraints bound the tool an agent asks for.
type CapabilityConstraints struct {
	NoNetwork     bool  `json:"no_network"`
	ReadOnlyInput bool  `json:"read_only_input"`
	MaxRuntimeMS  int64 `json:"max_runtime_ms"`
	MaxMemoryMB   int64 `json:"max_memory_mb"`
}

// DefaultCapabilityConstraints are the restrictive defaults: no
// network, read-only input, 1000 ms, 64 MB.
func DefaultCapabilityConstraints() CapabilityConstraints {
	return CapabilityConstraints{NoNetwork: true, ReadOnlyInput: true, MaxRuntimeMS: 1000, MaxMemoryMB: 64}
}

// CapabilityRequestKind is the only kind a capability request may have.
const CapabilityRequestKind = "capability_request"

// Capability request outcomes.
const (
	CapabilityGranted = "granted" // candidates and a child token
	CapabilityMatched = "matched" // candidates, no token (none asked, or policy gave none)
	CapabilityRefused = "refused" // no candidate, or the request was refused
)

// CapabilityCandidate is one registered tool that satisfies a request.
type CapabilityCandidate struct {
	ToolID  string      `json:"tool_id"`
	Version string      `json:"version"`
	Score   float64     `json:"score"`
	Terms   *ScoreTerms `json:"terms,omitempty"`
}

// CapabilityGrant is the child token a granted request carries.
type CapabilityGrant struct {
	Token     string    `json:"token"`
	TokenID   string    `json:"token_id"`
	Tools     []string  `json:"tools"`
	ExpiresAt time.Time `json:"expires_at"`
	MaxCalls  int64     `json:"max_calls"`
	// MaxRuntimeMS is the grant's total runtime budget.
	MaxRuntimeMS int64   `json:"max_runtime_ms"`
	MaxCost      float64 `json:"max_cost,omitempty"`
}

// CapabilityResponse answers a capability request.
type CapabilityResponse struct {
	RequestID  string                `json:"request_id"`
	Outcome    string                `json:"outcome"`
	Candidates []CapabilityCandidate `json:"candidates"`
	Grant      *CapabilityGrant      `json:"grant,omitempty"`
	// Refusal is why nothing was matched or granted: a ToolError with a
	// stable code.
	Refusal *Error `json:"refusal,omitempty"`
	// Considered says why each tool that names the capability was left
	// out, by tool id.
	Considered map[string]string `json:"considered,omitempty"`
}

// CapabilityReportRequest asks for a capability request's run report.
type CapabilityReportRequest struct {
	RequestID string `json:"request_id"`
}

// CapabilityReport is a capability request's run report: what
// was asked, matched and granted, and what the grant's calls used so far.
type CapabilityReport struct {
	RequestID   string             `json:"request_id"`
	Tenant      string             `json:"tenant"`
	RequestedAt time.Time          `json:"requested_at"`
	RequestedBy string             `json:"requested_by,omitempty"`
	Request     CapabilityRequest  `json:"request"`
	Response    CapabilityResponse `json:"response"`
	// Used is the grant's usage: calls, runtime, cost, failures.
	Used *CapabilityUsage `json:"used,omitempty"`
}

// CapabilityUsage is what the calls made with a grant used.
type CapabilityUsage struct {
	Calls               int64   `json:"calls"`
	RuntimeMS           int64   `json:"runtime_ms"`
	Cost                float64 `json:"cost"`
	Tokens              int64   `json:"tokens,omitempty"`
	ConsecutiveFailures int64   `json:"consecutive_failures"`
}
