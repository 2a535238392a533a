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

// detectorOrder is the order of the rows: prose first, then the inputs
// built to be slow (internal/detect's benchmark runs the same).
var detectorOrder = []string{"prose", "repeated quotes", "repeated ../", "repeated digits", "base64-like",
	"repeated a@", "instruction-heavy", "repeated a", "hex-like", "percent", "markdown links"}

// detectorInputs are 1 MiB texts: ordinary prose and inputs built to make
// backtracking regular expressions explode (RE2 stays linear) or a naive
// scanner slow.
func detectorInputs() map[string]string {
	const n = 1 << 20
	prose := "The quarterly report covers sales in three regions; see docs/guide.md for the method. Contact the team lead for access. "
	fill := func(unit string) string { return strings.Repeat(unit, n/len(unit)+1)[:n] }
	return map[string]string{
		"prose":             fill(prose),
		"repeated quotes":   fill("' OR "),
		"repeated ../":      fill("../"),
		"repeated digits":   fill("4111 "),
		"base64-like":       fill("eyJhbGciOiJIUzI1NiJ9"),
		"repeated a@":       fill("a@"),
		"instruction-heavy": fill("ignore the previous "),
		"repeated a":        fill("a"),
		"hex-like":          fill("deadbeef"),
		"percent":           fill("%2e%2e%2f"),
		"markdown links":    fill("![x](https://e.example/?q=abc) "),
	}
}

// detectorScans is how many times each input is scanned; the fastest scan
// is reported, as the one least disturbed by the rest of the machine. The
// first two or three scans of a fresh process run about half as slow again
// (its heap and the matchers' caches still growing), so a few more follow.
const detectorScans = 9

func measureDetectors() []DetectorCost {
	eng := detect.Default()
	inputs := detectorInputs()
	var out []DetectorCost
	for _, name := range detectorOrder {
		s := inputs[name]
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
