package bench

import (
	"fmt"
	"io"
	"runtime"
	"strings"
	"time"

	"github.com/toolgate/toolgate/internal/detect"
)

// DetectorCost is the time all detectors take per KiB of one kind of input.
type DetectorCost struct {
	Input   string
	PerKiB  time.Duration
	MiBPerS float64
}

// Goals of the detectors, per KiB scanned by all of them.
const (
	detectProseGoal       = 20 * time.Microsecond
	detectAdversarialGoal = 100 * time.Microsecond
)

// detectorScans is how many times each input is scanned; the fastest scan
// is reported, as the one least disturbed by the rest of the machine. The
// first two or three scans of a fresh process run about half as slow again
// (its heap and the matchers' caches still growing), so a few more follow.
const detectorScans = 9

func measureDetectors() []DetectorCost {
	eng := detect.Default()
	var out []DetectorCost
	// Prose first, then the inputs built against the scanner (internal/
	// detect's benchmark and linearity test read the same).
	for _, in := range detect.BenchInputs(1 << 20) {
		name, s := in.Name, in.Text
		runtime.GC()
		var d time.Duration
		for i := range detectorScans {
			start := time.Now()
			eng.Scan(s)
			if t := time.Since(start); i == 0 || t < d {
				d = t
			}
		}
		kib := float64(len(s)) / 1024
		out = append(out, DetectorCost{Input: name, PerKiB: time.Duration(float64(d) / kib), MiBPerS: kib / 1024 / d.Seconds()})
	}
	return out
}

// Goal is the most a KiB of this input may take.
func (c DetectorCost) Goal() time.Duration {
	if c.Input == "prose" {
		return detectProseGoal
	}
	return detectAdversarialGoal
}

func printDetectors(w io.Writer, cs []DetectorCost) {
	fmt.Fprintf(w, "\nsafety detectors (%d rules, all detectors), 1 MiB inputs, fastest of %d scans:\n", ruleCount(), detectorScans)
	fmt.Fprintf(w, "%-26s %12s %10s %10s\n", "input", "per KiB", "MiB/s", "goal")
	for _, c := range cs {
		verdict := "met"
		if c.PerKiB > c.Goal() {
			verdict = "NOT MET"
		}
		fmt.Fprintf(w, "%-26s %10.1fµs %10.1f %8.0fµs  %s\n", c.Input, float64(c.PerKiB.Nanoseconds())/1000, c.MiBPerS,
			float64(c.Goal().Microseconds()), verdict)
	}
}

func ruleCount() int {
	return strings.Count(string(detect.DefaultRules()), `"id":`)
}
