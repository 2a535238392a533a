package api

// ApprovalDecision is a request to approve or deny one invocation.
type ApprovalDecision struct {
	Tenant       string `json:"tenant_id"`
	InvocationID string `json:"invocation_id"`
	Approve      bool   `json:"approve"`
	DecidedBy    string `json:"decided_by"`
	Reason       string `json:"reason,omitempty"`
}
