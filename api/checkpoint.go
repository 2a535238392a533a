package api

import (
	"encoding/json"
	"time"
)

// The kinds of checkpoint (docs/checkpoints.md). A micro checkpoint is the
// state a tool reports as it goes, written at most once per interval and
// resumable for an hour; a macro checkpoint marks a milestone the tool
// declares and is kept for the operator's retention; a named checkpoint is
// kept until someone deletes it.
const (
	CheckpointMicro = "micro"
	CheckpointMacro = "macro"
	CheckpointNamed = "named"
)

// CheckpointKindValid reports whether kind is one of the three kinds.
func CheckpointKindValid(kind string) bool {
	return kind == CheckpointMicro || kind == CheckpointMacro || kind == CheckpointNamed
}

// Checkpoint describes one stored checkpoint (its state is read apart).
type Checkpoint struct {
	ID   string `json:"checkpoint_id"`
	Kind string `json:"checkpoint_type"`
	// Name is a named checkpoint's name, or a macro checkpoint's milestone.
	Name         string `json:"name,omitempty"`
	Tenant       string `json:"tenant_id"`
	InvocationID string `json:"invocation_id"`
	ToolID       string `json:"tool_id,omitempty"`
	ToolVersion  string `json:"tool_version,omitempty"`
	Seq          int    `json:"seq"`
	// Parent is the checkpoint before this one in the same run, or the
	// checkpoint the run was resumed from.
	Parent string `json:"parent_checkpoint_id,omitempty"`
	// Delta says the state is stored as an RFC 7386 merge patch against
	// Parent; Depth counts the deltas down to a whole state.
	Delta bool `json:"is_delta,omitempty"`
	Depth int  `json:"delta_depth,omitempty"`
	// Base is when the whole state a chain of deltas starts from was
	// stored.
	Base time.Time `json:"delta_base_at,omitzero"`
	// Encoding is how the stored bytes are encoded: "json" or "zstd".
	Encoding string `json:"encoding"`
	// StateBytes is the size of the state the tool saved; StoredBytes what
	// was stored after delta encoding and compression.
	StateBytes  int     `json:"state_bytes"`
	StoredBytes int     `json:"stored_bytes"`
	Chunks      int     `json:"chunks"`
	Percent     float64 `json:"progress_percent,omitempty"`
	// DocumentPins are the document versions the run had pinned when the
	// checkpoint was taken; a resumed run keeps them.
	DocumentPins json.RawMessage `json:"document_pins,omitempty"`
	CreatedAt    time.Time       `json:"created_at"`
	// ExpiresAt is when the checkpoint can no longer be resumed (E3707);
	// zero for named checkpoints.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Expired is set in listings of checkpoints whose time has passed.
	Expired bool `json:"expired,omitempty"`
	// StoredDigest is the SHA-256 (hex) of the stored bytes, and Sig the
	// execute stage's signature over this description without Sig: a run
	// resumes only from a checkpoint execute wrote under its own key (its
	// tenant, invocation and sequence), with the bytes it stored.
	StoredDigest string `json:"stored_sha256,omitempty"`
	Sig          string `json:"sig,omitempty"`
}

// CheckpointMetadata is one entry of a response's checkpoints_created.
type CheckpointMetadata struct {
	ID        string `json:"checkpoint_id"`
	Kind      string `json:"checkpoint_type"`
	Timestamp string `json:"timestamp"`
}

// CheckpointsRequest is the body of the checkpoints endpoints: list (of
// one invocation, or the whole tenant), get (one, with its state when
// WithState) and delete.
type CheckpointsRequest struct {
	TenantID     string `json:"tenant_id,omitempty"`
	InvocationID string `json:"invocation_id,omitempty"`
	CheckpointID string `json:"checkpoint_id,omitempty"`
	WithState    bool   `json:"with_state,omitempty"`
}

// CheckpointState is the answer of the get endpoint.
type CheckpointState struct {
	Checkpoint
	State json.RawMessage `json:"state,omitempty"`
}
