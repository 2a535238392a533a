//go:build race

package verify

// raceEnabled: the race detector multiplies CPU time, so CPU bounds are
// only logged.
const raceEnabled = true
