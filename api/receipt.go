package api

import "encoding/json"

// ReceiptVersion is the receipt format's version: 2 names the result
// message it rides in (Ending); a receipt of version 1 is read and checked
// as it was signed.
const ReceiptVersion = 2

// Receipt is audit's signed statement of how one invocation ended
// (docs/audit.md): who called what, under which policy decision, and the
// hashes of what was sent and returned, never the parameters or the
// result themselves. It is bound to the invocation's terminal audit
// event by EventID: the event carries the same receipt, so the event's
// inclusion proof under a signed checkpoint fixes the receipt in the
// trail. Every field but Sig is signed; times are RFC 3339 strings so
// that a decoded receipt encodes to the bytes that were signed.
type Receipt struct {
	V            int    `json:"v"`
	InvocationID string `json:"invocation_id"`
	Tenant       string `json:"tenant_id"`
	Agent        string `json:"agent_did,omitempty"`
	ToolID       string `json:"tool_id,omitempty"`
	ToolVersion  string `json:"tool_version,omitempty"`
	// ManifestDigest is the SHA-256 (hex) of the tool manifest authorize
	// judged the call on, as stored in the registry; empty for a call
	// refused before a manifest was resolved.
	ManifestDigest string `json:"manifest_sha256,omitempty"`
	// ParamsSHA256 is the SHA-256 (hex) of the request's parameters as
	// compact JSON (encoding/json's Compact of the bytes sent); empty
	// when the request had none.
	ParamsSHA256 string `json:"params_sha256,omitempty"`
	// PolicyRevision is the policies bucket's revision of the policy that
	// decided (0: the policy the workers were started with); Decision is
	// "allow", "deny", or empty for a call that ended before authorize
	// decided.
	PolicyRevision uint64 `json:"policy_revision,omitempty"`
	Decision       string `json:"decision,omitempty"`
	// Approvers are who approved the call; Approval is the last
	// approver's signed decision, as the control service verified it.
	Approvers []string       `json:"approvers,omitempty"`
	Approval  *DecisionProof `json:"approval,omitempty"`
	// Documents are the document versions the call read.
	Documents []DocumentPin `json:"documents,omitempty"`
	Status    Status        `json:"status"`
	ErrorCode string        `json:"error_code,omitempty"`
	// ResultSHA256 is the SHA-256 (hex) of the result as returned (the
	// response's result member as compact JSON); empty without a result.
	ResultSHA256 string `json:"result_sha256,omitempty"`
	// EventID is the terminal audit event's CloudEvent id; its AUDIT
	// sequence is the inclusion proof's (ReceiptResponse).
	EventID    string `json:"event_id"`
	ReceivedAt string `json:"received_at,omitempty"`
	IssuedAt   string `json:"issued_at"`
	// Ending is the SHA-256 (hex) of the result message that carries
	// the receipt, as audit published it without the receipt's member:
	// the receipt's signature is the message's too (version 2).
	Ending string `json:"ending_sha256,omitempty"`
	// Key is the public key (nkey, N…) of audit's chain key, which
	// signs; Sig the Ed25519 signature (base64) over every other field.
	Key string `json:"key"`
	Sig string `json:"sig,omitempty"`
}

// ReceiptRequest asks for the receipt of one invocation.
type ReceiptRequest struct {
	TenantID     string `json:"tenant_id,omitempty"`
	InvocationID string `json:"invocation_id"`
}

// ReceiptResponse is a receipt and, once a checkpoint covers its terminal
// audit event, that event's inclusion proof (auditchain.Proof); Pending
// says why there is no proof yet.
type ReceiptResponse struct {
	Receipt *Receipt        `json:"receipt"`
	Proof   json.RawMessage `json:"proof,omitempty"`
	Pending string          `json:"pending,omitempty"`
}
