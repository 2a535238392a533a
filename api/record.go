package api

import "time"

// Record is the stored state of one invocation.
type Record struct {
	InvocationID string `json:"invocation_id"`
	Tenant       string `json:"tenant_id"`
	Status       Status `json:"status"`
	// Agent is the agent that made the call (agent_context.agent_did,
	// which authorize holds to the capability token's agent_did): the
	// agent that may see the call's status, progress and checkpoints
	// besides operators and the tenant's readers.
	Agent       string    `json:"agent_did,omitempty"`
	ToolID      string    `json:"tool_id,omitempty"`
	ToolVersion string    `json:"tool_version,omitempty"`
	Error       *Error    `json:"error,omitempty"`
	Response    *Response `json:"response,omitempty"`
	// Seq is the ingest sequence of the publish this record belongs to.
	// With Digest it tells a redelivery of that publish (same sequence)
	// from another request that reuses the id.
	Seq uint64 `json:"ingest_seq"`
	// Digest identifies the request (see ClaimInvocation).
	Digest    string    `json:"request_digest,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
	// Ending names the message that ended the invocation (its stream and
	// sequence), written with the terminal status. The first ending wins:
	// audit republishes the outputs of a redelivery of that message and
	// drops any other message that would end the invocation a second time.
	Ending string `json:"ending,omitempty"`
	// CancelRequested survives later status writes until the invocation
	// ends: execute checks it before running the tool, and honours it only
	// with CancelSig, the control service's signature (its message-signing
	// key) over the tenant, the invocation id and CancelBy: every stage
	// may write this bucket, so the flag alone proves nothing. CancelBy is
	// the agent that asked, or "" for a principal that sees every call of
	// the tenant; execute honours an agent's cancel only on that agent's
	// call (a cancel may come before any stage recorded whose it is).
	CancelRequested bool   `json:"cancel_requested,omitempty"`
	CancelSig       string `json:"cancel_sig,omitempty"`
	CancelBy        string `json:"cancel_by,omitempty"`
	// Progress and Checkpoint are the latest a running tool reported.
	Progress   *Progress      `json:"progress,omitempty"`
	Checkpoint *CheckpointRef `json:"checkpoint,omitempty"`
	// DocumentPins are the document versions the call is held to
	// (document_context.version_pinning): a redelivered or resumed run
	// reads these, not the sources' latest.
	DocumentPins []DocumentPin `json:"document_pins,omitempty"`
	// Site is, for a call of a site's tool that has not ended, the site
	// it runs at and that site's link, as the control service found them
	// when asked (never stored).
	Site *SiteWait `json:"site,omitempty"`
}

// SiteWait is the site a call runs at, and what holds it there.
type SiteWait struct {
	Site string `json:"site"`
	// Link is "up" while the site's worker takes calls, else "down".
	Link string `json:"link"`
	// LastContact is when the site last asked for, took or acknowledged
	// a call; while the link is down, since when it has been down.
	LastContact *time.Time `json:"last_contact,omitempty"`
	// Queued are the calls waiting at the hub for the site.
	Queued uint64 `json:"queued"`
}

// Progress is what a running tool last said about how far it is.
type Progress struct {
	Percent   float64   `json:"percent"`
	Message   string    `json:"message,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// CheckpointRef names the latest checkpoint of an invocation.
type CheckpointRef struct {
	ID        string    `json:"checkpoint_id,omitempty"`
	Kind      string    `json:"checkpoint_type,omitempty"`
	Seq       int       `json:"seq"`
	Bytes     int       `json:"bytes"`
	CreatedAt time.Time `json:"created_at"`
}
