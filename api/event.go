package api

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// CloudEvent types of the public contract: the request, the answers, and the
// audit trail (the outcomes and the decisions of the stages).
const (
	// TypeInvoke is the type of an invocation request on tool.invoke.<tenant>.
	TypeInvoke = "tool.invoke"
	// TypeResult is the type of the one response on tool.result.<tenant>.<id>.
	TypeResult = "tool.result"
	// TypeAccepted is the pending answer to an async_mode request.
	TypeAccepted = "tool.accepted"

	TypeInvoked           = "ai.agent.tool.invoked"
	TypeSucceeded         = "ai.agent.tool.succeeded"
	TypeFailed            = "ai.agent.tool.failed"
	TypeTimeout           = "ai.agent.tool.timeout"
	TypeCancelled         = "ai.agent.tool.cancelled"
	TypeRejected          = "ai.agent.tool.rejected"
	TypePermissionDenied  = "ai.agent.tool.permission_denied"
	TypeRateLimited       = "ai.agent.tool.rate_limited"
	TypeCheckpointCreated = "ai.agent.tool.checkpoint.created"
	TypePoison            = "ai.agent.pipeline.poison"
	// TypeDuplicate records a later publish under an invocation id another
	// publish holds (E3024): a repeat of the same request, answered by the
	// first one's result, or a different request, refused. It is not
	// terminal: an invocation id has exactly one terminal event, its first
	// publish's.
	TypeDuplicate = "ai.agent.tool.duplicate"

	TypeApprovalRequested = "ai.agent.tool.approval.requested"
	TypeApprovalGranted   = "ai.agent.tool.approval.granted"
	TypeApprovalDenied    = "ai.agent.tool.approval.denied"
	TypeApprovalExpired   = "ai.agent.tool.approval.expired"

	// Capability requests: every request, then its outcome.
	TypeCapabilityRequested = "ai.agent.capability.requested"
	TypeCapabilityGranted   = "ai.agent.capability.granted"
	TypeCapabilityMatched   = "ai.agent.capability.matched"
	TypeCapabilityRefused   = "ai.agent.capability.refused"

	// Administrative changes through the control service (AdminChange),
	// under tenant _system.
	TypePolicyPushed        = "ai.agent.admin.policy.pushed"
	TypePolicyReset         = "ai.agent.admin.policy.reset"
	TypeHooksPushed         = "ai.agent.admin.hooks.pushed"
	TypeHooksDeleted        = "ai.agent.admin.hooks.deleted"
	TypeTokenRevoked        = "ai.agent.admin.token.revoked"
	TypeModelRegistered     = "ai.agent.admin.model.registered"
	TypeModelDeleted        = "ai.agent.admin.model.deleted"
	TypeDocSourceAdded      = "ai.agent.admin.docsource.added"
	TypeDocSourceRemoved    = "ai.agent.admin.docsource.removed"
	TypeSiteAdded           = "ai.agent.admin.site.added"
	TypeSiteRemoved         = "ai.agent.admin.site.removed"
	TypeRoutingPolicyPushed = "ai.agent.admin.routing_policy.pushed"
	TypeToolRegistered      = "ai.agent.admin.tool.registered"
	TypeToolDeleted         = "ai.agent.admin.tool.deleted"
	TypeToolPurged          = "ai.agent.admin.tool.purged"
	// TypeToolRefused: a registration refused for what the tool's texts
	// hold (E3865, E3866); details.findings name each field and detector.
	TypeToolRefused = "ai.agent.admin.tool.refused"
	// TypeToolDescriptionChanged: an imported tool's server lists it with
	// another digest than the pinned one; the change is held (E3869).
	TypeToolDescriptionChanged = "ai.agent.admin.tool.description_changed"
	// TypeToolChangeAccepted: an operator accepted a held change (a
	// tools.register with accept_digest), in place of tool.registered.
	TypeToolChangeAccepted = "ai.agent.admin.tool.change_accepted"
	// TypeStateRefused: a reader ignored a record that changes what calls
	// may do (a pushed policy) because no operator's signature covers it.
	TypeStateRefused = "ai.agent.state.refused"

	// Breaker transitions, under the tenant token _system.
	TypeCircuitOpened     = "ai.agent.circuit.opened"
	TypeCircuitHalfOpened = "ai.agent.circuit.half_opened"
	TypeCircuitClosed     = "ai.agent.circuit.closed"
	// TypeBusRefused: the bus refused a connection, on
	// audit._system.bus.refused.
	TypeBusRefused = "ai.agent.bus.refused"
	// TypeViewRefused: the control service refused an agent another
	// agent's call (E3260), on audit._system.view.refused.
	TypeViewRefused = "ai.agent.view.refused"
	// TypeAuditRecreated: toolgate found the AUDIT stream missing and
	// created it again, on audit._system.audit.recreated.
	TypeAuditRecreated = "ai.agent.audit.recreated"
	// TypeAuditArchiveFailed: a range of AUDIT could not be archived
	// (E3970), on audit._system.audit.archive.failed.
	TypeAuditArchiveFailed = "ai.agent.audit.archive.failed"
)

// MsgIDHeader is the header JetStream deduplicates publishes by.
const MsgIDHeader = "Nats-Msg-Id"

// MsgID is the Nats-Msg-Id a publisher sets for an event: CloudEvents treats
// equal source and id as the same event, so JetStream drops the repeat.
func MsgID(source, id string) string {
	sum := sha256.Sum256([]byte(source + "\x00" + id))
	return hex.EncodeToString(sum[:16])
}

// InvokeMsgID is the Nats-Msg-Id of a tool.invoke event for tenant: MsgID
// scoped by tenant, because the invoke stream's dedup window is shared by all
// tenants and equal ids from two tenants must never collide.
func InvokeMsgID(tenant, source, id string) string {
	sum := sha256.Sum256([]byte(tenant + "\x00" + source + "\x00" + id))
	return hex.EncodeToString(sum[:16])
}

// Event is a CloudEvent 1.0 with a JSON body, the shape of every event
// toolgate reads and writes. Extensions hold string-valued extension
// attributes such as traceparent.
type Event struct {
	ID              string
	Source          string
	Type            string
	Subject         string
	Time            time.Time
	DataContentType string
	Extensions      map[string]string
	Data            json.RawMessage
}

// NewEvent returns an event of type typ with data encoded as JSON.
func NewEvent(id, source, typ string, data any) (*Event, error) {
	b, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("encoding event data: %w", err)
	}
	return &Event{ID: id, Source: source, Type: typ, Time: time.Now().UTC(),
		DataContentType: "application/json", Data: b}, nil
}

// Binary encodes e in the CloudEvents NATS binding's binary mode: attributes
// as ce-* headers (values percent-encoded where a header cannot carry them),
// data as the body, and the Nats-Msg-Id derived from source and id.
func (e *Event) Binary() (header map[string][]string, body []byte, err error) {
	if e.ID == "" || e.Source == "" || e.Type == "" {
		return nil, nil, errors.New("invalid event: id, source and type are required")
	}
	h := map[string][]string{}
	set := func(k, v string) {
		if v != "" {
			h[k] = []string{encodeHeader(v)}
		}
	}
	set("ce-specversion", "1.0")
	set("ce-id", e.ID)
	set("ce-source", e.Source)
	set("ce-type", e.Type)
	set("ce-subject", e.Subject)
	if !e.Time.IsZero() {
		set("ce-time", e.Time.UTC().Format(time.RFC3339Nano))
	}
	for k, v := range e.Extensions {
		set("ce-"+k, v)
	}
	if e.DataContentType != "" {
		h["content-type"] = []string{e.DataContentType}
	}
	h[MsgIDHeader] = []string{MsgID(e.Source, e.ID)}
	return h, e.Data, nil
}

// encodeHeader percent-encodes what a header value cannot carry as is.
func encodeHeader(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c <= 0x20 || c >= 0x7f || c == '"' || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// DecodeStructured reads an event in structured mode (the whole event as one
// JSON object), as toolgate publishes results and audit events. Data sent as
// data_base64 is decoded.
func DecodeStructured(b []byte) (*Event, error) {
	var raw struct {
		SpecVersion     string          `json:"specversion"`
		ID              string          `json:"id"`
		Source          string          `json:"source"`
		Type            string          `json:"type"`
		Subject         string          `json:"subject"`
		Time            time.Time       `json:"time"`
		DataContentType string          `json:"datacontenttype"`
		Data            json.RawMessage `json:"data"`
		DataBase64      string          `json:"data_base64"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, err
	}
	if raw.SpecVersion == "" || raw.ID == "" || raw.Type == "" {
		return nil, errors.New("not a CloudEvent: specversion, id and type are required")
	}
	e := &Event{ID: raw.ID, Source: raw.Source, Type: raw.Type, Subject: raw.Subject, Time: raw.Time,
		DataContentType: raw.DataContentType, Data: raw.Data}
	if raw.DataBase64 != "" {
		d, err := base64.StdEncoding.DecodeString(raw.DataBase64)
		if err != nil {
			return nil, fmt.Errorf("decoding data_base64: %w", err)
		}
		e.Data = d
	}
	var ext map[string]json.RawMessage
	if json.Unmarshal(b, &ext) == nil {
		for k, v := range ext {
			switch k {
			case "specversion", "id", "source", "type", "subject", "time", "datacontenttype", "data", "data_base64", "dataschema":
				continue
			}
			var s string
			if json.Unmarshal(v, &s) == nil {
				if e.Extensions == nil {
					e.Extensions = map[string]string{}
				}
				e.Extensions[k] = s
			}
		}
	}
	return e, nil
}
