package api

import (
	"encoding/json"
	"time"
)

// redrivable are the codes of failures whose cause may be gone later: the
// call itself was not at fault. A call ended with one of them is kept in
// the dead-letter stream (docs/redrive.md). The outage codes count only
// when the error says it is retryable (a 4xx of an external service is
// E3304 too, and would fail again).
var (
	redrivableAlways = []string{EDeliveryExhausted, EPoisonMessage, EBreakerOpen, ERateLimited, EMCPServerDown}
	redrivableOutage = []string{EExternalStatus, EExternalUnreachable, EModelStreamCut, EModelChainExhausted, EExecutorUnavailable}
)

// Redrivable reports whether a call that ended with e is kept for a
// re-drive: it ended on a delivery limit, a poison message, an open
// breaker, a rate limit or a provider's outage.
func Redrivable(e *Error) bool {
	if e == nil {
		return false
	}
	for _, c := range redrivableAlways {
		if e.ECode == c {
			return true
		}
	}
	if !e.Retryable {
		return false
	}
	for _, c := range redrivableOutage {
		if e.ECode == c {
			return true
		}
	}
	return false
}

// RedrivableCodes lists the codes Redrivable may accept, for docs and help.
func RedrivableCodes() []string {
	return append(append([]string{}, redrivableAlways...), redrivableOutage...)
}

// DeadLetter is what the audit stage keeps of a call that ended on a
// redrivable failure: the request (without its capability token, raw or
// sealed), how it ended, and the principal authorize verified, which an
// operator's decision may re-drive it as.
type DeadLetter struct {
	InvocationID string    `json:"invocation_id"`
	Tenant       string    `json:"tenant_id"`
	ToolID       string    `json:"tool_id"`
	ToolVersion  string    `json:"tool_version,omitempty"`
	Status       Status    `json:"status"`
	Error        *Error    `json:"error"`
	EndedBy      string    `json:"ended_by,omitempty"`
	EndedAt      time.Time `json:"ended_at"`
	Request      Request   `json:"request"`
	// Principal is the verified claims of the call's token, signed by
	// authorize; absent when the call ended before its token was verified.
	Principal *DeadLetterPrincipal `json:"principal,omitempty"`
	// Seq is the dead-letter stream's sequence (set when read back).
	Seq uint64 `json:"seq,omitempty"`
}

// DeadLetterPrincipal is the principal of a dead-lettered call
// (envelope.Principal): signed by authorize (Sig), or, on a call authorize
// sealed, covered by the call's authorization seal (Seal, an
// envelope.Seal).
type DeadLetterPrincipal struct {
	Session string          `json:"session"`
	Claims  json.RawMessage `json:"claims"`
	Sig     string          `json:"sig,omitempty"`
	Seal    json.RawMessage `json:"seal,omitempty"`
}

// Redrive is set on the request of a re-drive: the dead-lettered call it
// runs again and who ran it. Proof is the operator's signed run request;
// a request that carries no capability token is admitted only by it
// (docs/redrive.md).
type Redrive struct {
	// Original is the dead-lettered invocation; Root the first of the
	// chain (a re-drive of a re-drive keeps it) and Depth its place.
	Original string `json:"original"`
	Root     string `json:"root"`
	Depth    int    `json:"depth"`
	// By is the operator who ran it (the identity that signed the run).
	By string `json:"by"`
	// Decision is true when the operator re-drove the call without the
	// caller's token, as the original's verified claims; Reason says why.
	Decision bool   `json:"decision,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// Principal is the original's principal, on a decision only.
	Principal *DeadLetterPrincipal `json:"principal,omitempty"`
	// Proof is the operator's signed redrive.run request.
	Proof *DecisionProof `json:"proof,omitempty"`
}

// RedriveFilter selects dead letters: a tenant's (required), by code, and
// ended at or after Since.
type RedriveFilter struct {
	Tenant string     `json:"tenant_id"`
	Code   string     `json:"code,omitempty"`
	Since  *time.Time `json:"since,omitempty"`
}

// RedriveListRequest asks for dead letters (redrive.list).
type RedriveListRequest struct {
	RedriveFilter
	Limit int `json:"limit,omitempty"`
}

// RedriveEntry is one dead letter in a listing, with what became of its
// re-drive when it had one.
type RedriveEntry struct {
	InvocationID string    `json:"invocation_id"`
	Tenant       string    `json:"tenant_id"`
	ToolID       string    `json:"tool_id"`
	Code         string    `json:"code"`
	Message      string    `json:"message"`
	EndedAt      time.Time `json:"ended_at"`
	// RedriveID is the invocation a re-drive of it runs as; RedriveStatus
	// its status when it was run ("" when never).
	RedriveID     string `json:"redrive_id"`
	RedriveStatus Status `json:"redrive_status,omitempty"`
}

// RedriveListResponse answers redrive.list, oldest first.
type RedriveListResponse struct {
	Entries []RedriveEntry `json:"entries"`
	More    bool           `json:"more,omitempty"`
}

// RedriveShowRequest asks for one dead letter (redrive.show).
type RedriveShowRequest struct {
	Tenant       string `json:"tenant_id"`
	InvocationID string `json:"invocation_id"`
}

// RedriveShowResponse is a dead letter, its parameters redacted.
type RedriveShowResponse struct {
	DeadLetter
	RedriveID     string `json:"redrive_id"`
	RedriveStatus Status `json:"redrive_status,omitempty"`
	// Digest is the SHA-256 of the dead letter as stored: a run that
	// names it (RedriveRunRequest.Digests) starts exactly this one.
	Digest string `json:"digest"`
}

// RedriveRunRequest re-drives dead letters (redrive.run): the ids named,
// or every one the filter selects. Each runs with the caller's token, still
// valid, sent in the RedriveTokenHeader header (TokenSHA256 is its digest,
// so the signed body, which every re-drive carries as its proof, holds no
// usable token), or, when Decision is set, as the original's verified
// claims on the operator's word, with Reason recorded.
type RedriveRunRequest struct {
	Tenant      string         `json:"tenant_id"`
	IDs         []string       `json:"invocation_ids,omitempty"`
	Filter      *RedriveFilter `json:"filter,omitempty"`
	TokenSHA256 string         `json:"capability_token_sha256,omitempty"`
	Decision    bool           `json:"decision,omitempty"`
	Reason      string         `json:"reason,omitempty"`
	By          string         `json:"by,omitempty"`
	// Digests names, by invocation id, the dead letter the operator was
	// shown (RedriveShowResponse.Digest): a dead letter that is not that
	// one any more is not re-driven (E3242). An operator's decision must
	// name one for each id it re-drives.
	Digests map[string]string `json:"digests,omitempty"`
	// At is when the operator asked: the proof's time, in the body it signs.
	At time.Time `json:"at"`
}

// RedriveRun is one re-drive started (or skipped: Error says why).
type RedriveRun struct {
	Original  string `json:"original"`
	RedriveID string `json:"redrive_id"`
	Error     *Error `json:"error,omitempty"`
}

// RedriveRunResponse answers redrive.run.
type RedriveRunResponse struct {
	Runs []RedriveRun `json:"runs"`
}

// RedriveTokenHeader carries the caller's capability token on a
// redrive.run request, outside the signed body.
const RedriveTokenHeader = "Toolgate-Redrive-Token"

// TypeRedriveRun records an operator's re-drive of dead-lettered calls
// (AdminChange, under tenant _system): who, which calls, and on whose
// authority (the caller's token or the operator's decision).
const TypeRedriveRun = "ai.agent.admin.redrive.run"

// RedriveOutcome is what a re-drive's execution metadata says of it.
type RedriveOutcome struct {
	Original string `json:"original"`
	Root     string `json:"root"`
	Depth    int    `json:"depth"`
	By       string `json:"by"`
	Decision bool   `json:"decision,omitempty"`
	Reason   string `json:"reason,omitempty"`
}
