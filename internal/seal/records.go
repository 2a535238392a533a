package seal

import (
	"slices"
	"strconv"

	"github.com/toolgate/toolgate/internal/busauth"
)

// Kinds of the run-time records one role signs for another to check
// (Signer.SignRecord): a record's signature is checked for its kind and
// its owner's role only, so one kind's signature never passes as another's.
const (
	// RecordCancel is a cancel request on an invocation's status record:
	// only the control service, which authenticated who asked, signs it.
	RecordCancel = "cancel"
	// RecordCheckpoint is a checkpoint's stored description: only execute
	// signs it.
	RecordCheckpoint = "checkpoint"
)

// cancelText is what a cancel signature covers: the tenant, the
// invocation id and the agent that asked ("" for a principal that sees
// every call), so a flag signed for one call, or one agent, proves
// nothing for another.
func cancelText(tenant, id, by string) []byte {
	return []byte(strconv.Quote(tenant) + "\n" + strconv.Quote(id) + "\n" + strconv.Quote(by))
}

// SignCancel signs a cancel request on tenant's invocation id asked by
// agent by (the control service's Signer).
func (s *Signer) SignCancel(tenant, id, by string) string {
	return s.SignRecord(RecordCancel, cancelText(tenant, id, by))
}

// CancelSigned reports whether sig is the control service's signature of a
// cancel request on tenant's invocation id asked by agent by.
func (m *Messages) CancelSigned(tenant, id, by, sig string) bool {
	return sig != "" && m.Record(busauth.RoleControl, RecordCancel, cancelText(tenant, id, by), sig)
}

// SignCheckpoint signs a checkpoint's description (execute's Signer).
func (s *Signer) SignCheckpoint(desc []byte) string { return s.SignRecord(RecordCheckpoint, desc) }

// CheckpointSigned reports whether sig is execute's signature of desc, or
// a site's worker's (its own key: a call it resumes is one it checkpointed).
func (m *Messages) CheckpointSigned(desc []byte, sig string) bool {
	if sig == "" {
		return false
	}
	if m.Record(busauth.RoleExecute, RecordCheckpoint, desc, sig) {
		return true
	}
	m.mu.RLock()
	var sites []busauth.Role
	for r := range m.keys {
		if _, ok := busauth.SiteOfRole(r); ok {
			sites = append(sites, r)
		}
	}
	m.mu.RUnlock()
	return slices.ContainsFunc(sites, func(r busauth.Role) bool { return m.Record(r, RecordCheckpoint, desc, sig) })
}
