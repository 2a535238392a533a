package api

import "encoding/json"

// Status is a ToolInvocationStatus.
type Status string

// The invocation statuses of the public contract.
const (
	StatusPending          Status = "pending"
	StatusRunning          Status = "running"
	StatusSuccess          Status = "success"
	StatusError            Status = "error"
	StatusTimeout          Status = "timeout"
	StatusCancelled        Status = "cancelled"
	StatusPermissionDenied Status = "permission_denied"
	StatusPendingApproval  Status = "pending_approval"
)

// Terminal reports whether s ends an invocation.
func (s Status) Terminal() bool {
	switch s {
	case StatusSuccess, StatusError, StatusTimeout, StatusCancelled, StatusPermissionDenied:
		return true
	}
	return false
}

// AgentContext identifies the agent, tenant and session a call is made for.
type AgentContext struct {
	AgentDID  string `json:"agent_did"`
	TenantID  string `json:"tenant_id"`
	SessionID string `json:"session_id,omitempty"`
	UserDID   string `json:"user_did,omitempty"`
}

// ResourceLimits narrow the tool's own limits for one call; they never widen them.
type ResourceLimits struct {
	CPUMillicoreLimit    int `json:"cpu_millicore_limit,omitempty"`
	MemoryMBLimit        int `json:"memory_mb_limit,omitempty"`
	TimeoutSeconds       int `json:"timeout_seconds,omitempty"`
	NetworkBandwidthMbps int `json:"network_bandwidth_mbps,omitempty"`
}

// ExecutionOptions shape how a call is run.
type ExecutionOptions struct {
	AsyncMode       bool   `json:"async_mode,omitempty"`
	Priority        string `json:"priority,omitempty"`
	IdempotencyKey  string `json:"idempotency_key,omitempty"`
	RequireApproval bool   `json:"require_approval,omitempty"`
	// DryRun stops the call before execute runs the tool (docs/tools.md#dry-runs).
	DryRun bool `json:"dry_run,omitempty"`
}

// DryRun reports whether r asks for a dry run.
func (r *Request) DryRun() bool {
	return r != nil && r.ExecutionOptions != nil && r.ExecutionOptions.DryRun
}

// DryRunPlan is what a dry run would have done.
type DryRunPlan struct {
	// ApprovalRequired: the call would have waited for a human, Approvers
	// of them; ApprovalReasons are the policy's.
	ApprovalRequired bool     `json:"approval_required"`
	Approvers        int      `json:"approvers,omitempty"`
	ApprovalReasons  []string `json:"approval_reasons,omitempty"`
	// BudgetCharge is what the call would have reserved of its session's
	// budget; nil when the token tree has no budget.
	BudgetCharge *BudgetCharge `json:"budget_charge,omitempty"`
	// Route is where the call would have run.
	Route *DryRunRoute `json:"route,omitempty"`
}

// BudgetCharge is what one call reserves of a session's budget.
type BudgetCharge struct {
	Calls       int     `json:"calls"`
	Cost        float64 `json:"cost,omitempty"`
	ModelTokens int64   `json:"model_tokens,omitempty"`
}

// DryRunRoute is the tool version and executor a call is routed to.
type DryRunRoute struct {
	ToolID      string `json:"tool_id"`
	ToolVersion string `json:"tool_version"`
	Executor    string `json:"executor"`
}

// CheckpointConfig configures checkpoints of long-running tools.
type CheckpointConfig struct {
	EnableCheckpointing       *bool  `json:"enable_checkpointing,omitempty"`
	CheckpointIntervalSeconds int    `json:"checkpoint_interval_seconds,omitempty"`
	ResumeFromCheckpointID    string `json:"resume_from_checkpoint_id,omitempty"`
}

// DocumentContext names documents a tool may consult.
type DocumentContext struct {
	DocumentRefs   []string `json:"document_refs,omitempty"`
	VersionPinning bool     `json:"version_pinning,omitempty"`
	Query          string   `json:"query,omitempty"`
}

// Request is the ToolInvokeRequest: the data of a tool.invoke CloudEvent.
type Request struct {
	ToolID           string            `json:"tool_id"`
	ToolVersion      string            `json:"tool_version,omitempty"`
	InvocationID     string            `json:"invocation_id,omitempty"`
	AgentContext     AgentContext      `json:"agent_context"`
	Parameters       json.RawMessage   `json:"parameters,omitempty"`
	CapabilityToken  string            `json:"capability_token,omitempty"`
	ResourceLimits   *ResourceLimits   `json:"resource_limits,omitempty"`
	DocumentContext  *DocumentContext  `json:"document_context,omitempty"`
	CheckpointConfig *CheckpointConfig `json:"checkpoint_config,omitempty"`
	ExecutionOptions *ExecutionOptions `json:"execution_options,omitempty"`
	// Link is set by toolgate on an invocation a hook started.
	Link *Link `json:"link,omitempty"`
	// Redrive is set by toolgate on a re-drive of a dead-lettered call
	// (docs/redrive.md).
	Redrive *Redrive `json:"redrive,omitempty"`
}

// ExecutionMetadata records how a call ran.
type ExecutionMetadata struct {
	DurationMS  int64  `json:"duration_ms"`
	StartedAt   string `json:"started_at,omitempty"`
	CompletedAt string `json:"completed_at,omitempty"`
	// CPUUsedMillicoreSeconds and MemoryPeakMB are filled by executors that can measure them.
	// (cli tools: the sandbox's accounting of its processes).
	CPUUsedMillicoreSeconds int64 `json:"cpu_used_millicore_seconds,omitempty"`
	MemoryPeakMB            int64 `json:"memory_peak_mb,omitempty"`
	// NetworkBytesIn and NetworkBytesOut are the bytes a networked run's
	// egress proxy carried from and to the hosts it reached; absent for a
	// run without network.
	NetworkBytesIn  *int64 `json:"network_bytes_in,omitempty"`
	NetworkBytesOut *int64 `json:"network_bytes_out,omitempty"`
	// ToolID and ToolVersion name what actually ran, after version resolution.
	ToolID      string `json:"tool_id,omitempty"`
	ToolVersion string `json:"tool_version,omitempty"`
	Executor    string `json:"executor,omitempty"`
	// Warnings carries non-fatal notices, such as a deprecated version.
	Warnings []string `json:"warnings,omitempty"`
	// ResumedFromCheckpoint is the checkpoint an interrupted run was
	// resumed from on this worker.
	ResumedFromCheckpoint int `json:"resumed_from_checkpoint,omitempty"`
	// ResumedFromCheckpointID is the checkpoint this run started from:
	// the interrupted run's last, or the one the request named.
	ResumedFromCheckpointID string `json:"resumed_from_checkpoint_id,omitempty"`
	// CheckpointsCreated lists the checkpoints this run stored.
	CheckpointsCreated []CheckpointMetadata `json:"checkpoints_created,omitempty"`
	// Attempts is how many times the tool was called (retries included).
	Attempts int `json:"attempts,omitempty"`
	// ReplayedFrom is the invocation whose result an idempotent repeat
	// returned instead of running the tool again.
	ReplayedFrom string `json:"replayed_from,omitempty"`
	// Stages records the time each stage took, in order.
	Stages []Hop `json:"stages,omitempty"`
	// Model is what a model tool used and how its model was chosen.
	Model *ModelUse `json:"model,omitempty"`
	// Hook is what a hook decided when the invocation ended, or the link
	// of an invocation a hook started.
	Hook *HookOutcome `json:"hook,omitempty"`
	// DocumentsAccessed lists the documents of document_context the call
	// was handed: id, version, source and size.
	DocumentsAccessed []DocumentAccess `json:"documents_accessed,omitempty"`
	// Redrive is set on a re-drive of a dead-lettered call: the call it
	// ran again and who ran it (docs/redrive.md).
	Redrive *RedriveOutcome `json:"redrive,omitempty"`
	// DryRun marks a call that stopped before the tool ran, and
	// DryRunPlan says what it would have done.
	DryRun     bool        `json:"dry_run,omitempty"`
	DryRunPlan *DryRunPlan `json:"dry_run_plan,omitempty"`
}

// Hop is one stage's passage.
type Hop struct {
	Stage      string `json:"stage"`
	DurationUS int64  `json:"duration_us"`
}

// PollingInfo tells an async caller where to look for the outcome.
type PollingInfo struct {
	ResultSubject string `json:"result_subject"`
	// StatusSubject is the tenant's own status endpoint
	// (tool.svc.<tenant>.status), the one the calling agent may use.
	StatusSubject string `json:"status_subject"`
}

// Response is the ToolInvokeResponse.
type Response struct {
	InvocationID      string             `json:"invocation_id"`
	Status            Status             `json:"status"`
	Result            json.RawMessage    `json:"result,omitempty"`
	Error             *Error             `json:"error,omitempty"`
	ExecutionMetadata *ExecutionMetadata `json:"execution_metadata,omitempty"`
	CheckpointRef     string             `json:"checkpoint_ref,omitempty"`
	PollingInfo       *PollingInfo       `json:"polling_info,omitempty"`
	// Receipt is audit's signed receipt of a terminal result.
	Receipt *Receipt `json:"receipt,omitempty"`
}

// StatusFor maps an error to the status it ends an invocation with.
func StatusFor(e *Error) Status {
	switch e.Code {
	case PermissionDenied:
		return StatusPermissionDenied
	case Timeout:
		return StatusTimeout
	case Cancelled:
		return StatusCancelled
	}
	return StatusError
}
