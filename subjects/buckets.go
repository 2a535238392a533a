package subjects

// KV bucket names. kvstore owns their layout; the bus permissions name them
// too, so they live here.
const (
	BucketTools        = "toolgate_tools"
	BucketInvocations  = "toolgate_invocations"
	BucketRevocations  = "toolgate_revocations"
	BucketPolicies     = "toolgate_policies"
	BucketApprovals    = "toolgate_approvals"
	BucketBudgets      = "toolgate_budgets"
	BucketRateLimits   = "toolgate_ratelimits"
	BucketIdempotency  = "toolgate_idempotency"
	BucketCheckpoints  = "toolgate_checkpoints"
	BucketBreakers     = "toolgate_breakers"
	BucketHooks        = "toolgate_hooks"
	BucketToolStats    = "toolgate_toolstats"
	BucketModelStats   = "toolgate_modelstats"
	BucketCapabilities = "toolgate_capabilities"
	// BucketAgentRuns counts each agent's running calls (E3106): leases
	// only execute writes.
	BucketAgentRuns = "toolgate_agentruns"
	// BucketSettings holds the cluster's security settings: the first
	// worker records them, and every later one must match them to start.
	BucketSettings = "toolgate_settings"
	// BucketModels holds the model catalogue: one entry per model, by name
	// (toolgate models register).
	BucketModels = "toolgate_models"
)

// Buckets lists every bucket.
var Buckets = []string{BucketTools, BucketInvocations, BucketRevocations, BucketPolicies, BucketApprovals,
	BucketBudgets, BucketRateLimits, BucketIdempotency, BucketCheckpoints, BucketBreakers, BucketHooks,
	BucketToolStats, BucketModelStats, BucketCapabilities, BucketSettings, BucketModels,
	BucketDocSources, BucketDocCache, BucketAgentRuns}

// BucketStream is the stream behind a bucket.
func BucketStream(bucket string) string { return "KV_" + bucket }

// BucketKeys is the subject of every key of a bucket, as JetStream stores
// them.
func BucketKeys(bucket string) string { return "$KV." + bucket + ".>" }

// BucketKey is the subject of one key of a bucket, as JetStream stores it.
func BucketKey(bucket, key string) string { return "$KV." + bucket + "." + key }

// AbortKeys is the key prefix, inside the invocations bucket, of the
// sessions a hook aborted: the only part of that bucket processes watch.
const AbortKeys = "_aborted"

// Watched changes of a bucket are republished by JetStream itself (the
// stream's RePublish, set by the operator with the topology) on
// toolgate.kv.<bucket>.<key>, with the key's revision in the Nats-Sequence
// header. A process watches a bucket with a plain subscription there: no
// role needs the right to create consumers, whose deliver subjects JetStream
// checks against nobody's permissions, and no role may publish there.
const kvFeedPrefix = "toolgate.kv."

// KVFeed is the prefix of a bucket's republished changes (ends with a dot).
func KVFeed(bucket string) string { return kvFeedPrefix + bucket + "." }

// WatchedKeys are the keys of each watched bucket whose changes are
// republished: the whole bucket but for the invocations bucket, where only
// the aborted sessions are watched.
func WatchedKeys(bucket string) (pattern string, ok bool) {
	switch bucket {
	case BucketTools, BucketRevocations, BucketPolicies, BucketHooks, BucketBreakers, BucketModels, BucketModelStats,
		BucketDocSources:
		return ">", true
	case BucketInvocations:
		return AbortKeys + ".>", true
	}
	return "", false
}

// BucketAuditArchive is the object store bucket the audit archive is kept
// in by default (docs/audit.md).
const BucketAuditArchive = "toolgate_audit_archive"

// ObjectStream is the stream behind an object store bucket.
func ObjectStream(bucket string) string { return "OBJ_" + bucket }

// ObjectAll is every subject of an object store bucket.
func ObjectAll(bucket string) string { return "$O." + bucket + ".>" }

// ObjectMetas is the subject of every object's description in a bucket.
func ObjectMetas(bucket string) string { return "$O." + bucket + ".M.>" }

// ObjectChunks is the subject of one object's chunks.
func ObjectChunks(bucket, nuid string) string { return "$O." + bucket + ".C." + nuid }
