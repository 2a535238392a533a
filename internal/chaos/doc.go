// Package chaos holds toolgate's fault-injection tests. They run real
// processes on loopback: nats-server built from the module's own dependency,
// and toolgate stage workers built from ./cmd/toolgate. Faults are real too:
// SIGKILL of workers and servers, a server's store wiped, and a node cut off
// from its cluster by a TCP proxy between the routes.
//
// Every scenario drives invocations of fs.append_file (not idempotent: each
// run appends the invocation id to a ledger file under the file root) and then
// reads the RESULT and AUDIT streams and the ledger. It holds toolgate to
// The guarantee: every admitted invocation (its publish acknowledged by
// JetStream) has exactly one result and one terminal audit event, and no
// invocation appended twice.
//
// `make test` runs a short variant (TOOLGATE_CHAOS_N unset: 300 invocations,
// single server); `make chaos` runs 10,000 invocations per scenario,
// including the three-node cluster (TOOLGATE_CHAOS_CLUSTER=1).
package chaos
