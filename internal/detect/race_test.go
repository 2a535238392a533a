//go:build race

package detect

// raceEnabled: the race detector multiplies CPU time and makes it uneven,
// so the linearity of scans is not timed under it, and the prefilter's
// agreement with full scans is checked on a sample.
const raceEnabled = true
