package api

import "time"

// Shadow policy audit events (docs/authorization.md): a candidate policy
// authorize evaluates beside the live one, enforcing only the live one.
const (
	// TypeShadowDiverged records one call on which the candidate decided
	// otherwise than the live policy (ShadowDivergence), on
	// audit.<tenant>.policy.shadow.diverged.
	TypeShadowDiverged = "ai.agent.policy.shadow.diverged"
	// Operators' changes to the candidate (AdminChange, tenant _system).
	TypeShadowPushed   = "ai.agent.admin.policy.shadow.pushed"
	TypeShadowPromoted = "ai.agent.admin.policy.shadow.promoted"
	TypeShadowDropped  = "ai.agent.admin.policy.shadow.dropped"
)

// ShadowDecision is one policy's decision on a call.
type ShadowDecision struct {
	Allow            bool     `json:"allow"`
	RequiresApproval bool     `json:"requires_approval,omitempty"`
	Code             string   `json:"code,omitempty"`
	Reasons          []string `json:"reasons,omitempty"`
}

// ShadowDivergence is the data of a policy.shadow.diverged event.
type ShadowDivergence struct {
	InvocationID string `json:"invocation_id"`
	TenantID     string `json:"tenant_id"`
	ToolID       string `json:"tool_id"`
	ToolVersion  string `json:"tool_version,omitempty"`
	AgentDID     string `json:"agent_did,omitempty"`
	// CandidateRevision is the candidate's revision in the policies bucket.
	CandidateRevision uint64         `json:"candidate_revision"`
	Live              ShadowDecision `json:"live"`
	Candidate         ShadowDecision `json:"candidate"`
	// Rule names what changed: the first reason of the policy that
	// denies or asks for approval, or "allow" when both allow.
	Rule string `json:"rule"`
}

// ShadowReportRequest asks for the divergences since Since (default: since
// the candidate was pushed).
type ShadowReportRequest struct {
	Since *time.Time `json:"since,omitempty"`
}

// ShadowCount is how many calls diverged for one key.
type ShadowCount struct {
	Key   string `json:"key"`
	Calls int    `json:"calls"`
}

// ShadowReport sums up the divergences of the candidate in force.
type ShadowReport struct {
	Candidate *PolicyBundle `json:"candidate,omitempty"`
	Diverged  int           `json:"diverged"`
	// NewlyDenied counts calls the live policy allowed and the candidate
	// would deny; NewlyAllowed the reverse.
	NewlyDenied  int           `json:"newly_denied"`
	NewlyAllowed int           `json:"newly_allowed"`
	ByTool       []ShadowCount `json:"by_tool"`
	ByTenant     []ShadowCount `json:"by_tenant"`
	ByRule       []ShadowCount `json:"by_rule"`
}

// TypeDecisionRecorded records the input authorize gave the live policy on
// one call and its decision, its parameters redacted as audit redacts them
// (DecisionRecord), on audit.<tenant>.policy.decision.recorded. Authorize
// writes it only when recording is on (serve --record-decisions); `toolgate
// policy replay` evaluates a candidate against them.
const TypeDecisionRecorded = "ai.agent.policy.decision.recorded"

// DecisionRecord is the data of a policy.decision.recorded event.
type DecisionRecord struct {
	InvocationID string         `json:"invocation_id"`
	TenantID     string         `json:"tenant_id"`
	ToolID       string         `json:"tool_id"`
	Input        map[string]any `json:"input"`
	Decision     ShadowDecision `json:"decision"`
	// RecordedAt is the event's time (set when read back).
	RecordedAt time.Time `json:"-"`
}

// ReplayResult is what a candidate would have changed of the recorded
// decisions (`toolgate policy replay`).
type ReplayResult struct {
	Recorded     int            `json:"recorded"`
	Changed      int            `json:"changed"`
	NewlyDenied  int            `json:"newly_denied"`
	NewlyAllowed int            `json:"newly_allowed"`
	Changes      []ReplayChange `json:"changes"`
}

// ReplayChange is one recorded call a candidate would decide otherwise.
type ReplayChange struct {
	InvocationID string         `json:"invocation_id"`
	TenantID     string         `json:"tenant_id"`
	ToolID       string         `json:"tool_id"`
	Time         time.Time      `json:"time"`
	Live         ShadowDecision `json:"live"`
	Candidate    ShadowDecision `json:"candidate"`
}
