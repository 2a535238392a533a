package envelope

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/toolgate/toolgate/api"
)

// auditTypePrefix is left off audit types in subjects: audit.<tenant>.tool.succeeded.
const auditTypePrefix = "ai.agent."

// SubjectSuffix is the part of an audit event type used in its subject.
func SubjectSuffix(typ string) string { return strings.TrimPrefix(typ, auditTypePrefix) }

// TerminalType is the type of the one terminal audit event of inv.
func TerminalType(inv *Invocation) string {
	switch inv.Status {
	case api.StatusSuccess:
		return api.TypeSucceeded
	case api.StatusTimeout:
		return api.TypeTimeout
	case api.StatusCancelled:
		return api.TypeCancelled
	case api.StatusPermissionDenied:
		return api.TypePermissionDenied
	}
	if inv.EndedBy == "validate" {
		return api.TypeRejected
	}
	if inv.Error != nil && inv.Error.Code == api.RateLimitExceeded {
		return api.TypeRateLimited
	}
	return api.TypeFailed
}

// AuditRecord is the data of every audit event about an invocation.
// Parameters are redacted; results are summarised, never copied.
type AuditRecord struct {
	InvocationID string                 `json:"invocation_id"`
	TenantID     string                 `json:"tenant_id"`
	AgentDID     string                 `json:"agent_did,omitempty"`
	SessionID    string                 `json:"session_id,omitempty"`
	ToolID       string                 `json:"tool_id,omitempty"`
	ToolVersion  string                 `json:"tool_version,omitempty"`
	Status       api.Status             `json:"status"`
	Stage        string                 `json:"stage,omitempty"`
	Error        any                    `json:"error,omitempty"`
	Parameters   json.RawMessage        `json:"parameters,omitempty"`
	Result       *ResultSummary         `json:"result,omitempty"`
	Priority     string                 `json:"priority,omitempty"`
	AsyncMode    bool                   `json:"async_mode,omitempty"`
	Metadata     *api.ExecutionMetadata `json:"execution_metadata,omitempty"`
	Findings     []Finding              `json:"findings,omitempty"`
	// Approvers: who approved the call, when several people had to.
	Approvers []string `json:"approvers,omitempty"`
	Source    string   `json:"event_source,omitempty"`
	Seq       uint64   `json:"ingest_seq"`
	// Receipt, on the terminal event, is the receipt the result carries:
	// the event's inclusion proof fixes it in the trail.
	Receipt *api.Receipt `json:"receipt,omitempty"`
}

// ResultSummary identifies a result without carrying it.
type ResultSummary struct {
	Bytes  int    `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// Audit returns the audit record of inv in its current state.
func (inv *Invocation) Audit() AuditRecord {
	rec := AuditRecord{
		InvocationID: inv.ID,
		TenantID:     inv.Tenant,
		ToolID:       inv.ToolID(),
		ToolVersion:  inv.ToolVersion(),
		Status:       inv.Status,
		Stage:        inv.EndedBy,
		Source:       inv.Event.Source,
		Seq:          inv.Event.Seq,
		Findings:     inv.Findings,
	}
	if inv.Authz != nil {
		rec.Approvers = inv.Authz.Approvers
	}
	if inv.Error != nil {
		rec.Error = inv.Error
	}
	if r := inv.Request; r != nil {
		rec.AgentDID, rec.SessionID = r.AgentContext.AgentDID, r.AgentContext.SessionID
		rec.Parameters = inv.redactedParameters(r.Parameters)
		if o := r.ExecutionOptions; o != nil {
			rec.Priority, rec.AsyncMode = o.Priority, o.AsyncMode
		}
	}
	if len(inv.Result) > 0 {
		sum := sha256.Sum256(inv.Result)
		rec.Result = &ResultSummary{Bytes: len(inv.Result), SHA256: hex.EncodeToString(sum[:])}
	}
	if inv.Status.Terminal() {
		md := inv.Metadata
		rec.Metadata = &md
	}
	return rec
}

// NewEvent builds a CloudEvent about inv, from source, carrying the trace
// context the invocation started from (distributed-tracing extension). Its id is unique per invocation and type.
func (inv *Invocation) NewEvent(source, typ string, data any) (*event.Event, error) {
	e := event.New()
	e.SetID(inv.ID + ":" + SubjectSuffix(typ))
	e.SetSource(source)
	e.SetType(typ)
	e.SetSubject(inv.ID)
	e.SetTime(time.Now().UTC())
	e.SetExtension("tenantid", inv.Tenant)
	tc := inv.Origin
	if tc.TraceParent == "" {
		tc = TraceContext{TraceParent: inv.TraceParent, TraceState: inv.TraceState}
	}
	if tc.TraceParent != "" {
		e.SetExtension("traceparent", tc.TraceParent)
		if tc.TraceState != "" {
			e.SetExtension("tracestate", tc.TraceState)
		}
	}
	if _, raw := data.([]byte); data == nil || raw {
		if err := e.SetData(event.ApplicationJSON, data); err != nil {
			return nil, err
		}
		return &e, nil
	}
	// What SetData writes (the SDK's codec is encoding/json), made by
	// Marshal: every call publishes several events.
	b, err := Marshal(data)
	if err != nil {
		return nil, err
	}
	e.SetDataContentType(event.ApplicationJSON)
	e.DataEncoded = b
	return &e, nil
}
