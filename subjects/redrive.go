package subjects

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// StreamDeadLetter keeps the calls that ended on a failure whose cause may
// pass (api.Redrivable), with their request, for `toolgate redrive`
// (docs/redrive.md). One subject per tenant and invocation, written by the
// audit role alone, read by control.
const StreamDeadLetter = "TOOLGATE_DEADLETTER"

const deadLetterPrefix = "toolgate.deadletter."

// DeadLetter is the subject of invocation id's dead letter in tenant.
func DeadLetter(tenant, id string) string { return deadLetterPrefix + tenant + "." + Token(id) }

// DeadLetterTenant matches every dead letter of tenant.
func DeadLetterTenant(tenant string) string { return deadLetterPrefix + tenant + ".*" }

// DeadLetterAll matches every dead letter.
const DeadLetterAll = deadLetterPrefix + ">"

// Re-drive endpoints, operators only (signed with operator credentials,
// like AdminServices). Each takes and answers the api types named.
const (
	// SvcRedriveList takes api.RedriveListRequest, SvcRedriveShow
	// api.RedriveShowRequest, SvcRedriveRun api.RedriveRunRequest.
	SvcRedriveList = "tool.svc.redrive.list"
	SvcRedriveShow = "tool.svc.redrive.show"
	SvcRedriveRun  = "tool.svc.redrive.run"
)

// RedriveID is the invocation id of the re-drive at depth of the chain
// rooted at root (its first dead-lettered call): one id per dead letter,
// so running one twice runs it once (validate refuses the second, E3024).
// It stays within MaxIDBytes however long root is.
func RedriveID(root string, depth int) string {
	suffix := fmt.Sprintf(".redrive%d", depth)
	if len(root)+len(suffix) > MaxIDBytes {
		sum := sha256.Sum256([]byte(root))
		root = hex.EncodeToString(sum[:16])
	}
	return root + suffix
}
