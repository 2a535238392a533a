package topology

import (
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/subjects"
)

// Bounds of the dead-letter stream (docs/redrive.md). A dead letter is a
// second chance, not a record (the audit trail is that): when full, the
// oldest go first, so a flood of failures never stops audit ending calls.
const (
	DeadLetterMaxAge   = DefaultQueueMaxAge
	DeadLetterMaxBytes = 256 << 20
	DeadLetterMaxMsgs  = 100_000
)

// deadLetterStream keeps one message per tenant and invocation: a
// redelivered ending replaces its own dead letter rather than adding one.
func deadLetterStream(o TopologyOptions) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name: subjects.StreamDeadLetter, Description: "calls ended on failures whose cause may pass, kept for a re-drive",
		Subjects: []string{subjects.DeadLetterAll}, Retention: jetstream.LimitsPolicy,
		MaxAge: DeadLetterMaxAge, MaxBytes: DeadLetterMaxBytes, MaxMsgs: DeadLetterMaxMsgs, MaxMsgsPerSubject: 1,
		Discard: jetstream.DiscardOld, AllowDirect: true,
		Duplicates: o.Duplicates, Replicas: o.Replicas, Storage: o.Storage,
	}
}
