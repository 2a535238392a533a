// Package envelope holds toolgate's data model: the ToolInvokeRequest and
// ToolInvokeResponse of the public contract, and the Invocation envelope that
// carries one request, and what each stage learned about it, from stage to
// stage.
package envelope

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/redact"
)

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
	Request *api.Request    `json:"request,omitempty"`
	// Principal is set by the authorize stage as soon as the capability
	// token verifies, before it decides: the token tree's budget key and
	// the verified claims (never the raw token). Hooks use it to authorise
	// a retry or fallback as the same principal, and to end its session.
	Principal *Principal `json:"principal,omitempty"`
	// Custody is the MAC, for audit alone, of the stage that handed the
	// call to its holder, over the holder, the tenant, the invocation id
	// and the ingest sequence (seal.Signer.Custody): authorize makes
	// route's (and control's, for a call it parks), route execute's,
	// execute verify's. A stage after authorize, or control ending a
	// parked call, shows with it that the call was handed to it: audit
	// takes no ending of theirs without their own, so no stage can end a
	// call it never held, even with a custody copied from another's hop.
	Custody string `json:"custody,omitempty"`
	// Again is set by validate when this publish had claimed the id
	// before: a redelivery of validate's input, or a re-drive from the
	// ingest after the hops were lost. The stages that charge a call
	// (authorize's budget, route's rate limit) then look for a charge it
	// may already have taken rather than take a second.
	Again bool `json:"again,omitempty"`
	// Authz is set by the authorize stage when it admits the invocation.
	Authz *Authorization `json:"authz,omitempty"`
	// Route is set by the route stage.
	Route *Route `json:"route,omitempty"`

	Status   api.Status            `json:"status"`
	Result   json.RawMessage       `json:"result,omitempty"`
	Error    *api.Error            `json:"error,omitempty"`
	Metadata api.ExecutionMetadata `json:"metadata"`
	// EndedBy names the stage that set the terminal status.
	EndedBy string `json:"ended_by,omitempty"`
	// Findings are what the safety detectors found, and did about it.
	Findings []Finding `json:"findings,omitempty"`
	// DocumentPins are the document versions the call is held to
	// (document_context.version_pinning). Execute reads them before the
	// invocation record's and sets them once resolved: a checkpoint keeps
	// them beside its state, and a run resumed from it sets them here.
	DocumentPins []api.DocumentPin `json:"document_pins,omitempty"`
	// Invoked is execute's tool.invoked CloudEvent, when the tool ended
	// before execute announced it (stages.AnnounceAfter): audit publishes
	// it before the ending, under the message id the announcement would
	// have had.
	Invoked json.RawMessage `json:"invoked,omitempty"`

	// redacted caches the parameters' redacted form for Audit: a call
	// writes several audit records in one process (in serve the
	// invocation passes between stages in memory), and the parameters do
	// not change after validate. Never encoded: a hop's reader redacts
	// for itself, trusting no form an earlier stage wrote.
	redacted redactedParams
	// kept is what the last Encode wrote of Request, Principal and Authz,
	// once sealed: written again while they are the same (Encode). They
	// are replaced, never changed in place, once authorize sealed the call.
	kept *kept
	// idKey is the digest MsgID takes of Tenant and ID, made once for
	// every message of the call this process sends (in serve the
	// invocation passes between stages in memory).
	idKey idKey
}

// idKey is the start of a message id's digest of tenant and id.
type idKey struct {
	tenant, id string
	sum        [8]byte
}

// redactedParams is redact.Redact(of), for the parameters slice of.
type redactedParams struct {
	of, out json.RawMessage
}

// redactedParameters returns redact.Redact(p), computed once for the same
// parameters: the same bytes in the same place (a RawMessage is replaced,
// never written over).
func (inv *Invocation) redactedParameters(p json.RawMessage) json.RawMessage {
	c := &inv.redacted
	if len(p) == 0 {
		return nil
	}
	if len(c.of) == len(p) && &c.of[0] == &p[0] {
		return c.out
	}
	c.of, c.out = p, redact.Redact(p)
	return c.out
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
	TokenID  string `json:"token_id"`
	AgentDID string `json:"agent_did"`
	// Session is the budget key of the token tree (its root token's id),
	// charged for every call of any token of the tree.
	Session string `json:"session"`
	// TokenBudget is the key of a child token's own budget, charged beside
	// Session; empty for a root token.
	TokenBudget string `json:"token_budget,omitempty"`
	Reserved    bool   `json:"budget_reserved,omitempty"`
	// Unmetered is set when the token tree has no budget: nothing was
	// reserved and nothing is charged when the call ends.
	Unmetered   bool    `json:"unmetered,omitempty"`
	CostPerCall float64 `json:"cost_per_call,omitempty"`
	// ModelTokens and ModelCost are what the call's model requests may use
	// together, held of its budgets by authorize (kvstore.Hold); execute
	// sizes each request to fit. Zero bounds nothing.
	ModelTokens int64   `json:"model_tokens,omitempty"`
	ModelCost   float64 `json:"model_cost,omitempty"`
	ApprovedBy  string  `json:"approved_by,omitempty"`
	// Approvers are the different people who approved the call under the
	// two-person rule (a tool's safety.approvers).
	Approvers []string `json:"approvers,omitempty"`
	Grants    Grants   `json:"grants,omitzero"`
	// ApprovalProof is the last approver's signed decision, as authorize
	// verified it: audit names it in the call's receipt.
	ApprovalProof *api.DecisionProof `json:"approval_proof,omitempty"`
	// PolicyRevision is the policies bucket's revision of the policy that
	// admitted the call (0: the configured one); ManifestDigest the
	// SHA-256 of the manifest it was judged on (tools.Manifest.Digest).
	PolicyRevision uint64 `json:"policy_revision,omitempty"`
	ManifestDigest string `json:"manifest_sha256,omitempty"`
	// Seal is authorize's signature over its decision (internal/seal):
	// execute runs only invocations whose seal verifies.
	Seal *Seal `json:"seal,omitempty"`
}

// Seal binds an authorization to one invocation: the fields it names are
// signed, in clear so a refusal can say which one a hop changed. The
// digests are SHA-256 (hex) of the request as authorize handed it on (the
// capability token removed) and of the Authorization without its Seal.
type Seal struct {
	// Key names the public key that verifies Sig (an nkey, N…).
	Key         string `json:"key"`
	Tenant      string `json:"tenant"`
	ID          string `json:"id"`
	Seq         uint64 `json:"seq"`
	ToolID      string `json:"tool_id"`
	ToolVersion string `json:"tool_version"`
	Request     string `json:"request"`
	Authz       string `json:"authz"`
	// Principal is the SHA-256 (hex) of PrincipalText, when the call has a
	// principal: the seal's one signature vouches for it to audit and to a
	// re-drive, with no signature of its own.
	Principal string `json:"principal,omitempty"`
	// Decision is what authorize decided ("allow").
	Decision string `json:"decision"`
	// Expires is when the seal stops admitting the call (Unix ms): the
	// capability token's expiry.
	Expires int64 `json:"exp"`
	// Sig is the Ed25519 signature (base64url) over the fields above.
	Sig string `json:"sig"`
}

// Principal is who a verified capability token speaks for.
type Principal struct {
	// Session is the budget key of the token tree (its root token's id).
	Session string `json:"session"`
	// Claims are the token's verified claims, as JSON.
	Claims json.RawMessage `json:"claims"`
	// Sig is authorize's signature over the principal of this invocation
	// (PrincipalText), on a call authorize did not seal; a sealed call's
	// principal is covered by its seal (Seal.Principal). Audit starts a
	// hook's child as these claims only if one of them verifies, so no
	// other stage can hand audit claims of its own.
	Sig string `json:"sig,omitempty"`
}

// PrincipalText is what authorize signs of inv's principal: tenant,
// invocation id, session and claims.
func PrincipalText(inv *Invocation) []byte {
	p := inv.Principal
	b := make([]byte, 0, len(inv.Tenant)+len(inv.ID)+len(p.Session)+len(p.Claims)+3)
	b = append(append(b, inv.Tenant...), '\n')
	b = append(append(b, inv.ID...), '\n')
	b = append(append(b, p.Session...), '\n')
	return append(b, p.Claims...)
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
func (inv *Invocation) Parked() bool { return inv.Status == api.StatusPendingApproval }

// Route is the route stage's decision.
type Route struct {
	ToolID      string `json:"tool_id"`
	ToolVersion string `json:"tool_version"`
	Executor    string `json:"executor"`
	// Site is the site whose execute runs the call; empty: the hub's.
	Site string `json:"site,omitempty"`
	// SiteDeadline is when a call still waiting for its site ends
	// (E3271) instead of running.
	SiteDeadline time.Time `json:"site_deadline,omitzero"`
	// SiteBinding is route's proof, to verify, that it sent the call to
	// Site (seal.Signer.SiteBinding).
	SiteBinding string `json:"site_binding,omitempty"`
}

// Fail ends the invocation with err, mapping the error's code to a status.
func (inv *Invocation) Fail(stage string, err error) {
	// The error's text goes to the caller and the audit trail: whatever
	// stage wrote it, a secret it echoes does not.
	te := redact.Error(api.AsError(err))
	inv.Error = te
	inv.Status = api.StatusFor(te)
	inv.EndedBy = stage
}

// Succeed ends the invocation with result.
func (inv *Invocation) Succeed(stage string, result json.RawMessage) {
	inv.Result = result
	inv.Status = api.StatusSuccess
	inv.EndedBy = stage
}

// Terminal reports whether the invocation has ended.
func (inv *Invocation) Terminal() bool { return inv.Status.Terminal() }

// Agent is the agent the request names (agent_context.agent_did, which
// authorize holds to the capability token), or "" before the request is
// decoded: whose call it is, and whose result subject it ends on.
func (inv *Invocation) Agent() string {
	if inv.Request == nil {
		return ""
	}
	return inv.Request.AgentContext.AgentDID
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
func (inv *Invocation) Response() api.Response {
	md := inv.Metadata
	md.ToolID, md.ToolVersion = inv.ToolID(), inv.ToolVersion()
	resp := api.Response{
		InvocationID:      inv.ID,
		Status:            inv.Status,
		Result:            inv.Result,
		Error:             inv.Error,
		ExecutionMetadata: &md,
	}
	// An async call's answer names its last checkpoint, to resume from.
	if n := len(md.CheckpointsCreated); n > 0 && inv.Request != nil && inv.Request.ExecutionOptions != nil && inv.Request.ExecutionOptions.AsyncMode {
		resp.CheckpointRef = md.CheckpointsCreated[n-1].ID
	}
	return resp
}

// MsgID is the Nats-Msg-Id of what this invocation's pipeline publishes at
// step (a hand-off to a stage, an audit event, the result): the same for
// every delivery of one accepted publish, so a redelivered input never
// duplicates its successor. It names the ingest sequence and the tenant and
// invocation id: should a sequence ever be handed out twice (a clustered
// stream whose leader lost a write it had delivered), the second
// invocation's messages still differ from the first's and are not dropped
// as duplicates.
func (inv *Invocation) MsgID(step string) string {
	// Built in place: every hop and event of every call takes one.
	var buf [128]byte
	return string(inv.AppendMsgID(buf[:0], step))
}

// AppendMsgID appends MsgID(step) to b.
func (inv *Invocation) AppendMsgID(b []byte, step string) []byte {
	k := &inv.idKey
	if k.tenant != inv.Tenant || k.id != inv.ID || k.tenant == "" && k.id == "" {
		var buf [128]byte
		key := append(append(append(buf[:0], inv.Tenant...), 0), inv.ID...)
		sum := sha256.Sum256(key)
		*k = idKey{tenant: inv.Tenant, id: inv.ID, sum: [8]byte(sum[:8])}
	}
	b = strconv.AppendUint(b, inv.Event.Seq, 10)
	b = hex.AppendEncode(append(b, '.'), k.sum[:])
	return append(append(b, '.'), step...)
}

// RequestDigest is the SHA-256 (hex) of r's JSON encoding: what an
// approval binds. encoding/json writes every field of a request the same
// way after a decode, so each hop recomputes the same digest.
func RequestDigest(r *api.Request) string {
	if r == nil {
		return ""
	}
	b, err := Marshal(r)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
