// Package token is toolgate's capability token: a JWT naming what one agent
// of one tenant may call, with which resources, until when, and within which
// budget. It verifies tokens against an operator's key set, mints them, and
// derives narrower child tokens from a parent (attenuation).
package token

import (
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/golang-jwt/jwt/v5"
)

// OperationExecute is the operation an invocation needs.
const OperationExecute = "execute"

// Claims are a capability token's payload. The registered claims (iss, sub,
// aud, exp, nbf, iat, jti) sit beside the grants.
type Claims struct {
	// ToolID is the tool or tools granted: exact ids or patterns where `*`
	// stands for any run of characters ("fs.*", "mcp:github:*", "*").
	ToolID Patterns `json:"tool_id"`
	// ToolVersion is a semver range the called version must satisfy; empty
	// allows any version.
	ToolVersion string `json:"tool_version,omitempty"`
	AgentDID    string `json:"agent_did"`
	TenantID    string `json:"tenant_id"`
	// SessionID binds the token to one session when set.
	SessionID         string   `json:"session_id,omitempty"`
	AllowedOperations []string `json:"allowed_operations,omitempty"`

	Filesystem  *FilesystemGrant `json:"filesystem_permissions,omitempty"`
	Network     *NetworkGrant    `json:"network_permissions,omitempty"`
	Credentials *CredentialGrant `json:"credential_permissions,omitempty"`

	// ExcludedSideEffects are side-effect tags the holder may not cause; a
	// tag excludes itself and its sub-tags ("network" excludes "network.http").
	ExcludedSideEffects []string `json:"excluded_side_effects,omitempty"`
	// PreApproved are tool patterns whose high-risk calls need no human
	// approval. Critical calls always do.
	PreApproved Patterns `json:"pre_approved,omitempty"`
	// Budget caps the usage of this token and the tokens derived from it,
	// across every session; nil is no budget. A token tree shares its root's
	// budget, and a child's own (never wider) budget caps its own calls too.
	Budget *Budget `json:"budget,omitempty"`
	// RootBudget is the root token's budget, carried by derived tokens so
	// that the tree's shared budget is known whichever token calls.
	RootBudget *Budget `json:"root_budget,omitempty"`
	// TenantReader lets the holder see every call of its tenant (results,
	// status, progress, checkpoints, audit history), not only its own
	// agent's: an explicit opt-in an operator mints
	// (`toolgate token mint --tenant-reader`). A derived token keeps it
	// only when it asks for it and its parent has it.
	TenantReader bool `json:"tenant_reader,omitempty"`
	// Chain lists the ids (jti) of the tokens this one was derived from,
	// root first: revoking any of them revokes this one.
	Chain []string `json:"chain,omitempty"`

	jwt.RegisteredClaims
}

// FilesystemGrant lists paths (under the deployment's file root) the holder
// may touch, and how.
type FilesystemGrant struct {
	AllowedPaths []string `json:"allowed_paths"`
	Mode         string   `json:"mode,omitempty"` // "ro" (default) or "rw"
}

// NetworkGrant lists hosts (exact, or "*.example.com") and ports; no ports
// means any port of an allowed host.
type NetworkGrant struct {
	AllowedHosts []string `json:"allowed_hosts"`
	AllowedPorts []int    `json:"allowed_ports,omitempty"`
}

// CredentialGrant lists secrets by name.
type CredentialGrant struct {
	AllowedSecrets []string `json:"allowed_secrets"`
}

// Budget caps one session's usage. Zero fields are unlimited.
type Budget struct {
	MaxCalls     int64   `json:"max_calls,omitempty"`
	MaxRuntimeMS int64   `json:"max_runtime_ms,omitempty"`
	MaxCost      float64 `json:"max_cost,omitempty"`
	MaxTokens    int64   `json:"max_tokens,omitempty"`
	// ApprovalAfterFailures requires a human's approval once this many calls
	// in a row have failed.
	ApprovalAfterFailures int64 `json:"approval_after_failures,omitempty"`
}

// Patterns is a list of tool patterns. In JSON it is a string or an array of
// strings, so the specification's single tool_id reads as it is.
type Patterns []string

// UnmarshalJSON accepts "id" and ["id", ...].
func (p *Patterns) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*p = Patterns{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("tool patterns: want a string or an array of strings")
	}
	*p = many
	return nil
}

// MarshalJSON writes a single pattern as a string.
func (p Patterns) MarshalJSON() ([]byte, error) {
	if len(p) == 1 {
		return json.Marshal(p[0])
	}
	return json.Marshal([]string(p))
}

// Match reports whether id is granted by any pattern.
func (p Patterns) Match(id string) bool {
	return slices.ContainsFunc(p, func(pat string) bool { return matchPattern(pat, id) })
}

// matchPattern matches id against a pattern whose only wildcard is `*`. A
// literal `*` in id is matched like any character, which makes the same
// function decide pattern containment: if pattern a matches pattern b read
// literally, every id b matches, a matches too.
func matchPattern(pattern, id string) bool {
	// path.Match treats '/' as a separator and knows ? and [ ]; checkPattern
	// keeps those out of patterns and ids never contain '/'.
	if strings.ContainsRune(id, '/') {
		return false
	}
	ok, err := path.Match(pattern, id)
	return err == nil && ok
}

// checkPattern refuses pattern syntax beyond `*`: with `?` or classes the
// containment test above would not be sound.
func checkPattern(p string) error {
	if p == "" || strings.ContainsAny(p, "?[]\\/") {
		return fmt.Errorf("tool pattern %q: only letters, digits, punctuation and * are allowed", p)
	}
	return nil
}

// Root is the id of the token tree's root: the first of the chain, or the
// token itself.
func (c *Claims) Root() string {
	if len(c.Chain) > 0 {
		return c.Chain[0]
	}
	return c.ID
}

// BudgetKey is the key usage of the token with id jti is kept under.
func BudgetKey(jti string) string { return "token:" + jti }

// TreeBudget is the budget of the whole token tree: the root's, which
// Attenuate copies into every child as root_budget. A child without it
// (minted by another issuer) answers its own budget, which is never wider
// than its root's.
func (c *Claims) TreeBudget() *Budget {
	if len(c.Chain) > 0 && c.RootBudget != nil {
		return c.RootBudget
	}
	return c.Budget
}

// Revocations is the set of revoked token ids a worker holds in memory, kept
// in step with the revocation bucket.
type Revocations struct{ m sync.Map }

// Set marks jti revoked (on) or not.
func (r *Revocations) Set(jti string, on bool) {
	if on {
		r.m.Store(jti, struct{}{})
	} else {
		r.m.Delete(jti)
	}
}

// Revoked reports whether c or any token it was derived from is revoked,
// and which.
func (r *Revocations) Revoked(c *Claims) (string, bool) {
	for _, id := range append(slices.Clone(c.Chain), c.ID) {
		if _, ok := r.m.Load(id); ok {
			return id, true
		}
	}
	return "", false
}
