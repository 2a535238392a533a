//go:build race

package detect

// raceEnabled: the race detector multiplies CPU time and makes it uneven,
// so the linearity of scans is not timed under it.
const raceEnabled = true
