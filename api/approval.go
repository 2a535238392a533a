package api

import (
	"encoding/json"
	"time"
)

// Approval states.
const (
	ApprovalPending  = "pending"
	ApprovalApproved = "approved"
	ApprovalDenied   = "denied"
	ApprovalExpired  = "expired"
	// ApprovalCancelled: the invocation was cancelled while it waited.
	ApprovalCancelled = "cancelled"
)

// Approval is a human decision on one invocation, asked for or made: the
// record the approvals service stores and answers a decision with.
type Approval struct {
	InvocationID string    `json:"invocation_id"`
	Tenant       string    `json:"tenant_id"`
	ToolID       string    `json:"tool_id"`
	ToolVersion  string    `json:"tool_version"`
	Reasons      []string  `json:"reasons,omitempty"`
	State        string    `json:"state"`
	RequestedAt  time.Time `json:"requested_at"`
	Deadline     time.Time `json:"deadline"`
	DecidedAt    time.Time `json:"decided_at,omitzero"`
	DecidedBy    string    `json:"decided_by,omitempty"`
	Reason       string    `json:"reason,omitempty"`
	// Invocation is the parked pipeline envelope, resumed or ended on decision.
	Invocation json.RawMessage `json:"invocation"`
	// Proof is the signed request that decided, when the control service
	// verified one: authorize verifies it again before it admits an
	// approved call, so a record written straight into the bucket approves
	// nothing.
	Proof *DecisionProof `json:"proof,omitempty"`
	// Required is how many different people must approve (the tool's
	// safety.approvers) when more than one; authorize takes it from the
	// manifest, not from here.
	Required int `json:"approvals_required,omitempty"`
	// Approvals are the approvals recorded under the two-person rule, each
	// with its own signed decision: the call stays pending until Required
	// different people approved, and the last is also DecidedBy/Proof.
	Approvals []Approver `json:"approvals,omitempty"`
}

// Approver is one person's approval of a call that needs several.
type Approver struct {
	DecidedBy string         `json:"decided_by"`
	DecidedAt time.Time      `json:"decided_at"`
	Reason    string         `json:"reason,omitempty"`
	Proof     *DecisionProof `json:"proof,omitempty"`
}

// DecisionProof is a signed decision request as the control service
// received it (busauth.Signer): subject, headers (the signature's among
// them) and body.
type DecisionProof struct {
	Subject string              `json:"subject"`
	Headers map[string][]string `json:"headers"`
	Body    []byte              `json:"body"`
}

// ApprovalDecision is a request to approve or deny one invocation.
type ApprovalDecision struct {
	Tenant       string `json:"tenant_id"`
	InvocationID string `json:"invocation_id"`
	Approve      bool   `json:"approve"`
	DecidedBy    string `json:"decided_by"`
	Reason       string `json:"reason,omitempty"`
	// RequestDigest binds an approval to the request reviewed: the
	// request_digest of the ApprovalSummary the decider saw. An approval
	// whose digest is not the parked request's is refused (E3220), and
	// authorize admits the call only if its request still has it.
	RequestDigest string `json:"request_digest,omitempty"`
	// Proof is set by the control service, never read from the wire.
	Proof *DecisionProof `json:"-"`
}

// ApprovalsRequest asks for a tenant's pending approvals, or with an
// invocation id for one approval in any state.
type ApprovalsRequest struct {
	Tenant       string `json:"tenant_id"`
	InvocationID string `json:"invocation_id,omitempty"`
}

// ApprovalSummary is an approval as the control service shows it: the
// parked call's parameters redacted, never the parked envelope.
type ApprovalSummary struct {
	InvocationID string          `json:"invocation_id"`
	Tenant       string          `json:"tenant_id"`
	ToolID       string          `json:"tool_id"`
	ToolVersion  string          `json:"tool_version"`
	AgentDID     string          `json:"agent_did,omitempty"`
	Reasons      []string        `json:"reasons,omitempty"`
	Parameters   json.RawMessage `json:"parameters,omitempty"`
	// RequestDigest identifies the parked request exactly (tool, version,
	// parameters, agent context, capability token, options): an approval
	// names it (ApprovalDecision.RequestDigest).
	RequestDigest string    `json:"request_digest,omitempty"`
	State         string    `json:"state"`
	RequestedAt   time.Time `json:"requested_at"`
	Deadline      time.Time `json:"deadline"`
	DecidedAt     time.Time `json:"decided_at,omitzero"`
	DecidedBy     string    `json:"decided_by,omitempty"`
	Reason        string    `json:"reason,omitempty"`
	// Required and Approvers: under the two-person rule, how many
	// different people must approve and who has.
	Required  int      `json:"approvals_required,omitempty"`
	Approvers []string `json:"approvers,omitempty"`
}

// ApprovalsResponse lists approvals.
type ApprovalsResponse struct {
	Approvals []ApprovalSummary `json:"approvals"`
}
