//go:build race

package auditchain_test

// raceEnabled: the race detector slows and skews CPU time, so the cost
// measurements run a tenth of their calls under it, for their checks alone.
const raceEnabled = true
