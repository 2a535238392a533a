package api

import (
	"encoding/json"
	"time"
)

// Administrative requests of the control service (control API 1.3): the
// operator's changes to policy, tenant hooks, token revocations, circuit
// breakers and the model catalogue. On an authenticated bus every request is
// signed with operator credentials (busauth.Signer; client.Client.Sign) and
// the change records the signing operator, "operator:<name>", as who made
// it: a By in the body counts only on a bus without authentication. Each
// change is audited (ai.agent.admin.* events under tenant _system, or the
// breaker's ai.agent.circuit.* event).

// PolicyPushRequest pushes the authorization policy: Rego modules by file
// name and the data document, as `toolgate policy push DIR` reads them.
type PolicyPushRequest struct {
	Modules map[string]string `json:"modules"`
	Data    map[string]any    `json:"data,omitempty"`
	By      string            `json:"by,omitempty"`
	// CandidateDigest, on a shadow promote, is the digest of the candidate
	// the operator was shown (PolicyBundle.Digest): the signed promote
	// makes live exactly that candidate or nothing (E3241).
	CandidateDigest string `json:"candidate_digest,omitempty"`
}

// PolicyPushResponse is the pushed policy's revision in the policies bucket.
type PolicyPushResponse struct {
	Revision uint64 `json:"revision"`
	Modules  int    `json:"modules"`
	PushedBy string `json:"pushed_by"`
}

// PolicyResetResponse answers policy.reset: the revision of the pushed
// policy removed (0: none was pushed) and who removed it.
type PolicyResetResponse struct {
	Removed uint64 `json:"removed_revision"`
	ResetBy string `json:"reset_by"`
}

// PolicyBundle is the pushed policy (policy.get); Pushed is false when none
// was pushed and workers use their configured policy.
type PolicyBundle struct {
	Pushed   bool              `json:"pushed"`
	Revision uint64            `json:"revision,omitempty"`
	PushedAt time.Time         `json:"pushed_at,omitzero"`
	PushedBy string            `json:"pushed_by,omitempty"`
	Modules  map[string]string `json:"modules,omitempty"`
	Data     map[string]any    `json:"data,omitempty"`
	// Digest, of a shadow candidate, is the SHA-256 of what is shown
	// (revision, pushed_at, pushed_by, modules, data), for the promote to
	// sign.
	Digest string `json:"digest,omitempty"`
}

// HooksPushRequest makes Doc (a hook set, {"hooks":[…]}, as JSON) the
// tenant's hooks.
type HooksPushRequest struct {
	TenantID string          `json:"tenant_id"`
	Doc      json.RawMessage `json:"doc"`
	By       string          `json:"by,omitempty"`
}

// HooksPushResponse is the pushed set's revision and number of hooks.
type HooksPushResponse struct {
	TenantID string `json:"tenant_id"`
	Revision uint64 `json:"revision"`
	Hooks    int    `json:"hooks"`
	PushedBy string `json:"pushed_by"`
}

// HooksRequest names a tenant: hooks.delete's, or hooks.list's filter
// (empty lists every tenant's).
type HooksRequest struct {
	TenantID string `json:"tenant_id,omitempty"`
	By       string `json:"by,omitempty"`
}

// HookSet is a tenant's pushed hooks.
type HookSet struct {
	TenantID string          `json:"tenant_id"`
	Revision uint64          `json:"revision"`
	PushedAt time.Time       `json:"pushed_at"`
	PushedBy string          `json:"pushed_by,omitempty"`
	Doc      json.RawMessage `json:"doc"`
}

// HooksResponse lists hook sets by tenant.
type HooksResponse struct {
	HookSets []HookSet `json:"hook_sets"`
}

// RevokeRequest revokes the token with id JTI, and every token derived
// from it, until Until (the latest time the token could still verify).
type RevokeRequest struct {
	JTI    string    `json:"jti"`
	Until  time.Time `json:"until"`
	Reason string    `json:"reason,omitempty"`
	By     string    `json:"by,omitempty"`
}

// RevokeResponse confirms a revocation.
type RevokeResponse struct {
	JTI       string    `json:"jti"`
	Until     time.Time `json:"until"`
	RevokedBy string    `json:"revoked_by"`
}

// Breaker states a BreakerSetRequest may set; empty releases a forced
// breaker to its failure counting.
const (
	BreakerOpen    = "open"
	BreakerClosed  = "closed"
	BreakerRelease = ""
)

// BreakerSetRequest forces the breaker Key open or closed, or releases it.
type BreakerSetRequest struct {
	Key   string `json:"key"`
	State string `json:"state"`
	By    string `json:"by,omitempty"`
}

// BreakerState is one circuit breaker as the breakers bucket holds it.
type BreakerState struct {
	Key       string    `json:"key"`
	State     string    `json:"state"`
	Since     time.Time `json:"since"`
	Probes    int       `json:"probes,omitempty"`
	Successes int       `json:"successes,omitempty"`
	Forced    bool      `json:"forced,omitempty"`
	By        string    `json:"by,omitempty"`
}

// BreakersResponse lists the breakers.
type BreakersResponse struct {
	Breakers []BreakerState `json:"breakers"`
}

// ModelRequest registers (or replaces) Model, a model document
// (docs/models.md), or names one to delete.
type ModelRequest struct {
	Model json.RawMessage `json:"model,omitempty"`
	Name  string          `json:"name,omitempty"`
	By    string          `json:"by,omitempty"`
}

// ModelsResponse lists the catalogue's model documents.
type ModelsResponse struct {
	Models []json.RawMessage `json:"models"`
}

// RoutingPolicyRequest replaces the model routing policy with Rego, or
// restores the shipped one when Reset is set.
type RoutingPolicyRequest struct {
	Rego  string `json:"rego,omitempty"`
	Reset bool   `json:"reset,omitempty"`
	By    string `json:"by,omitempty"`
}

// AdminChange is the data of an ai.agent.admin.* audit event: what changed,
// who changed it (the authenticated operator) and when.
type AdminChange struct {
	Action string `json:"action"`
	By     string `json:"by"`
	// Target names what changed: a tenant, a token id, a model name.
	Target   string         `json:"target,omitempty"`
	Revision uint64         `json:"revision,omitempty"`
	Reason   string         `json:"reason,omitempty"`
	Details  map[string]any `json:"details,omitempty"`
	At       time.Time      `json:"at"`
	// BreakGlass marks a change signed with the operator credential, not
	// a named person's (docs/security.md, people's roles).
	BreakGlass bool `json:"break_glass,omitempty"`
}

// TypeAdminRefused: the control service refused a signed request, on
// audit._system.admin.refused: its signature did not verify, or its
// signer's role may not send it (AdminChange: action is the endpoint,
// by the signer when known, reason why, details.code the E-code).
const TypeAdminRefused = "ai.agent.admin.refused"
