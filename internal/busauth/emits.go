package busauth

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/toolgate/toolgate/subjects"
)

// MayEmit says why role may not emit, on subject (an audit event's or a
// result's, as audit would publish it), a CloudEvent of type typ from
// source about tenant ("" when the event names none), or "" when it may:
// one of the role's Emissions must match the subject, the type and the
// source together, and an audit event's type must be the one its subject
// names (audit.<tenant>.<type less ai.agent.>), so no event travels under
// another type's subject, nor inside another's.
func MayEmit(role Role, subject, typ, source, tenant string) string {
	rr, ok := RightsOf(role)
	if !ok {
		return fmt.Sprintf("role %s emits nothing", role)
	}
	if typ == "" || source == "" {
		return "the event names no type or source"
	}
	t, ok := subjects.TenantOfRelayed(subject)
	if !ok || (tenant != "" && tenant != t) {
		return fmt.Sprintf("an event of tenant %q on a subject of tenant %q", tenant, t)
	}
	if !eventType(typ) {
		return fmt.Sprintf("type %q is not a CloudEvent type toolgate emits", typ)
	}
	if suffix, ok := strings.CutPrefix(typ, auditTypePrefix); subjects.IsAudit(subject) && (!ok || subject != subjects.AuditEvent(t, suffix)) {
		return fmt.Sprintf("an event of type %s on %s, the subject of another type", typ, subject)
	}
	for _, e := range rr.Emits {
		if !server.SubjectMatchesFilter(subject, e.Subject) || !slices.Contains(e.Sources, source) {
			continue
		}
		for _, t := range e.Types {
			if server.SubjectMatchesFilter(typ, t) {
				return ""
			}
		}
	}
	return fmt.Sprintf("role %s emits no %s event from %s on %s", role, typ, source, subject)
}

// eventType reports whether typ is dot-separated tokens, none empty or a
// wildcard: the types are matched as subjects are.
func eventType(typ string) bool {
	for tok := range strings.SplitSeq(typ, ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n") {
			return false
		}
	}
	return typ != ""
}

// auditTypePrefix is left off audit event types in their subjects
// (envelope.SubjectSuffix).
const auditTypePrefix = "ai.agent."
