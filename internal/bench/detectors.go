package bench

import (
	"fmt"
	"github.com/toolgate/toolgate/internal/detect"
	"io"
	"strings"
	"time"
)

// DetectorCost is the time all detectors take per KiB of one kind of input.
type DetectorCost struct {
	Input   string
	PerKiB  time.Duration
	MiBPerS float64
}

// detectorInputs are 1 MiB texts: ordinary prose and inputs built to make
// backtracking regular expressions explode (RE2 stays linear).
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
	}
}

func measureDetectors() []DetectorCost {
	eng := detect.Default()
	var out []DetectorCost
	for _, name := range []string{"prose", "repeated quotes", "repeated ../", "repeated digits", "base64-like", "repeated a@", "instruction-heavy"} {
		s := detectorInputs()[name]
		start := time.Now()
		eng.Scan(s)
		d := time.Since(start)
		kib := float64(len(s)) / 1024
		out = append(out, DetectorCost{Input: name, PerKiB: time.Duration(float64(d) / kib), MiBPerS: kib / 1024 / d.Seconds()})
	}
	return out
}

func printDetectors(w io.Writer, cs []DetectorCost) {
	fmt.Fprintf(w, "\nsafety detectors (%d rules, all detectors), 1 MiB inputs:\n", ruleCount())
	fmt.Fprintf(w, "%-26s %12s %10s\n", "input", "per KiB", "MiB/s")
	for _, c := range cs {
		fmt.Fprintf(w, "%-26s %10.1fµs %10.1f\n", c.Input, float64(c.PerKiB.Nanoseconds())/1000, c.MiBPerS)
	}
}

func ruleCount() int {
	return strings.Count(string(detect.DefaultRules()), `"id":`)
}
