package subjects

import "strings"

// Only the audit role publishes audit events and results. Every other role
// emits its own (a call's start, checkpoints, breaker transitions, approval
// requests, the pending answer, poison, admin events) on the relay: the
// same subject under RelayPrefix, kept in StreamRelay until audit checks
// who sent it and publishes it on its own subject.
const (
	StreamRelay = "TOOLGATE_RELAY"
	relayPrefix = "toolgate.relay."
	// RelayAll matches every relayed subject.
	RelayAll = relayPrefix + ">"
)

// RelayInput is audit's durable consumer of the relay.
var RelayInput = Input{Stream: StreamRelay, Consumer: "audit-relay", Filter: RelayAll}

// Relayed reports whether subject is one only audit publishes: an audit
// event or a result.
func Relayed(subject string) bool {
	return strings.HasPrefix(subject, auditPrefix) || strings.HasPrefix(subject, resultPrefix)
}

// IsAudit reports whether subject is an audit event's.
func IsAudit(subject string) bool { return strings.HasPrefix(subject, auditPrefix) }

// IsResult reports whether subject is a result subject.
func IsResult(subject string) bool { return strings.HasPrefix(subject, resultPrefix) }

// Relay is the subject on which a role other than audit emits subject.
func Relay(subject string) string { return relayPrefix + subject }

// Unrelay is the subject audit publishes a relayed message on, and whether
// relayed names one at all.
func Unrelay(relayed string) (string, bool) {
	s, ok := strings.CutPrefix(relayed, relayPrefix)
	return s, ok && Relayed(s)
}

// TenantOfRelayed is the tenant an audit event or result subject names.
func TenantOfRelayed(subject string) (string, bool) {
	if t, ok := TenantOfAudit(subject); ok {
		return t, true
	}
	rest, ok := strings.CutPrefix(subject, resultPrefix)
	if !ok {
		return "", false
	}
	t, _, ok := strings.Cut(rest, ".")
	return t, ok && t != ""
}

// AuditOTLPInput is the durable consumer through which audit sends AUDIT to
// a SIEM over OTLP (serve --audit-otlp): its own, so an export that stops
// resumes where it stopped, whatever the other readers of AUDIT do.
var AuditOTLPInput = Input{Stream: StreamAudit, Consumer: "audit-otlp", Filter: AuditAll}
