// Package invocation holds toolgate's data model: the ToolInvokeRequest and
// ToolInvokeResponse of the public contract, and the Invocation envelope that
// carries one request, and what each stage learned about it, from stage to
// stage.
package invocation

import (
	"encoding/json"
	"time"

	"github.com/toolgate/toolgate/stages/toolerr"
)

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
}

// ExecutionMetadata records how a call ran.
type ExecutionMetadata struct {
	DurationMS  int64  `json:"duration_ms"`
	StartedAt   string `json:"started_at,omitempty"`
	CompletedAt string `json:"completed_at,omitempty"`
	// CPUUsedMillicoreSeconds and MemoryPeakMB are filled by executors that can measure them.
	CPUUsedMillicoreSeconds int64 `json:"cpu_used_millicore_seconds,omitempty"`
	MemoryPeakMB            int64 `json:"memory_peak_mb,omitempty"`
	// ToolID and ToolVersion name what actually ran, after version resolution.
	ToolID      string `json:"tool_id,omitempty"`
	ToolVersion string `json:"tool_version,omitempty"`
	Executor    string `json:"executor,omitempty"`
	// Warnings carries non-fatal notices, such as a deprecated version.
	Warnings []string `json:"warnings,omitempty"`
	// ResumedFromCheckpoint is the checkpoint an interrupted run was
	// resumed from on this worker.
	ResumedFromCheckpoint int `json:"resumed_from_checkpoint,omitempty"`
	// Attempts is how many times the tool was called (retries included).
	Attempts int `json:"attempts,omitempty"`
	// ReplayedFrom is the invocation whose result an idempotent repeat
	// returned instead of running the tool again.
	ReplayedFrom string `json:"replayed_from,omitempty"`
	// Stages records the time each stage took, in order.
	Stages []Hop `json:"stages,omitempty"`
}

// Hop is one stage's passage.
type Hop struct {
	Stage      string `json:"stage"`
	DurationUS int64  `json:"duration_us"`
}

// PollingInfo tells an async caller where to look for the outcome.
type PollingInfo struct {
	ResultSubject string `json:"result_subject"`
	StatusSubject string `json:"status_subject"`
}

// Response is the ToolInvokeResponse.
type Response struct {
	InvocationID      string             `json:"invocation_id"`
	Status            Status             `json:"status"`
	Result            json.RawMessage    `json:"result,omitempty"`
	Error             *toolerr.Error     `json:"error,omitempty"`
	ExecutionMetadata *ExecutionMetadata `json:"execution_metadata,omitempty"`
	CheckpointRef     string             `json:"checkpoint_ref,omitempty"`
	PollingInfo       *PollingInfo       `json:"polling_info,omitempty"`
}

// Event holds the CloudEvent attributes of the tool.invoke event that started
// an invocation.
type Event struct {
	ID          string    `json:"id"`
	Source      string    `json:"source"`
	Type        string    `json:"type"`
	SpecVersion string    `json:"specversion"`
	Time        time.Time `json:"time,omitzero"`
	// Mode is "binary" or "structured".
	Mode string `json:"mode"`
	// Size is the size of the NATS message (headers and body) in bytes.
	Size int `json:"size"`
	// Seq is the ingest stream sequence: unique per accepted publish, so it
	// keys the message ids of every later hop.
	Seq uint64 `json:"seq"`
}

// Invocation is the envelope that moves between stages. Each stage reads it,
// adds what it decided, and hands it on; audit turns it into the response,
// the audit events and the terminal status.
type Invocation struct {
	// ID is the invocation id: the CloudEvent id, or "seq-N" for a message that
	// was not a CloudEvent at all.
	ID string `json:"id"`
	// Tenant is the tenant token of the subject the event arrived on.
	Tenant     string    `json:"tenant"`
	Event      Event     `json:"event"`
	ReceivedAt time.Time `json:"received_at"`
	// TraceParent and TraceState carry W3C trace context from hop to hop.
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
	// Origin is the context the invocation's trace started from: the
	// caller's, or the first hop's span when the caller sent none. Every
	// event about the invocation carries it, so a reader of audit or results
	// lands in the caller's trace, not on one hop.
	Origin TraceContext `json:"origin,omitzero"`
	// Data is the raw event data until validate has checked and decoded it
	// into Request.
	Data    json.RawMessage `json:"data,omitempty"`
	Request *Request        `json:"request,omitempty"`
	// Authz is set by the authorize stage when it admits the invocation.
	Authz *Authorization `json:"authz,omitempty"`
	// Route is set by the route stage.
	Route *Route `json:"route,omitempty"`

	Status   Status            `json:"status"`
	Result   json.RawMessage   `json:"result,omitempty"`
	Error    *toolerr.Error    `json:"error,omitempty"`
	Metadata ExecutionMetadata `json:"metadata"`
	// EndedBy names the stage that set the terminal status.
	EndedBy string `json:"ended_by,omitempty"`
	// Findings are what the safety detectors found, and did about it.
	Findings []Finding `json:"findings,omitempty"`
}

// TraceContext is a W3C trace context.
type TraceContext struct {
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
}

// Finding is one detector match and the action taken on it.
type Finding struct {
	Rule         string `json:"rule"`
	Detector     string `json:"detector"`
	Path         string `json:"path,omitempty"`
	Action       string `json:"action"`
	RulesVersion string `json:"rules_version"`
	// Count, on a summary entry past the bound of findings per invocation,
	// is how many findings of this rule and action were left out.
	Count int `json:"count,omitempty"`
}

// Authorization is what the authorize stage established: whose token, which
// session budget was charged, who approved, and the resources the token
// grants, for the executors to enforce.
type Authorization struct {
	TokenID     string  `json:"token_id"`
	AgentDID    string  `json:"agent_did"`
	Session     string  `json:"session"`
	Reserved    bool    `json:"budget_reserved,omitempty"`
	CostPerCall float64 `json:"cost_per_call,omitempty"`
	ApprovedBy  string  `json:"approved_by,omitempty"`
	Grants      Grants  `json:"grants,omitzero"`
}

// Grants are the resources a capability token allows.
type Grants struct {
	Paths    []string `json:"paths,omitempty"`
	PathMode string   `json:"path_mode,omitempty"`
	Hosts    []string `json:"hosts,omitempty"`
	Ports    []int    `json:"ports,omitempty"`
	Secrets  []string `json:"secrets,omitempty"`
}

// Priority is the invocation's scheduling priority (high, normal or low).
func (inv *Invocation) Priority() string {
	if inv.Request != nil && inv.Request.ExecutionOptions != nil && inv.Request.ExecutionOptions.Priority != "" {
		return inv.Request.ExecutionOptions.Priority
	}
	return "normal"
}

// Parked reports whether the invocation waits outside the pipeline (for a
// human's approval): neither handed on nor ended.
func (inv *Invocation) Parked() bool { return inv.Status == StatusPendingApproval }

// Route is the route stage's decision.
type Route struct {
	ToolID      string `json:"tool_id"`
	ToolVersion string `json:"tool_version"`
	Executor    string `json:"executor"`
}

// Fail ends the invocation with err, mapping the error's code to a status.
func (inv *Invocation) Fail(stage string, err error) {
	te := toolerr.As(err)
	inv.Error = te
	inv.Status = StatusFor(te)
	inv.EndedBy = stage
}

// Succeed ends the invocation with result.
func (inv *Invocation) Succeed(stage string, result json.RawMessage) {
	inv.Result = result
	inv.Status = StatusSuccess
	inv.EndedBy = stage
}

// Terminal reports whether the invocation has ended.
func (inv *Invocation) Terminal() bool { return inv.Status.Terminal() }

// StatusFor maps an error to the status it ends an invocation with.
func StatusFor(e *toolerr.Error) Status {
	switch e.Code {
	case toolerr.PermissionDenied:
		return StatusPermissionDenied
	case toolerr.Timeout:
		return StatusTimeout
	case toolerr.Cancelled:
		return StatusCancelled
	}
	return StatusError
}

// ToolID returns the tool the invocation asked for, if known.
func (inv *Invocation) ToolID() string {
	if inv.Route != nil {
		return inv.Route.ToolID
	}
	if inv.Request != nil {
		return inv.Request.ToolID
	}
	return ""
}

// ToolVersion returns the resolved version, or the requested one.
func (inv *Invocation) ToolVersion() string {
	if inv.Route != nil {
		return inv.Route.ToolVersion
	}
	if inv.Request != nil {
		return inv.Request.ToolVersion
	}
	return ""
}

// Response builds the ToolInvokeResponse of a terminal invocation.
func (inv *Invocation) Response() Response {
	md := inv.Metadata
	md.ToolID, md.ToolVersion = inv.ToolID(), inv.ToolVersion()
	return Response{
		InvocationID:      inv.ID,
		Status:            inv.Status,
		Result:            inv.Result,
		Error:             inv.Error,
		ExecutionMetadata: &md,
	}
}
