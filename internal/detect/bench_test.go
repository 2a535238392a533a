package detect

import (
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/cputime"
)

// BenchmarkDetectors reports µs per KiB of all detectors on each 1 MiB
// input of BenchInputs (make bench prints the same rows).
func BenchmarkDetectors(b *testing.B) {
	e := Default()
	for _, in := range BenchInputs(1 << 20) {
		s := in.Text
		b.Run(strings.ReplaceAll(in.Name, " ", "_"), func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			for b.Loop() {
				e.Scan(s)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/float64(len(s)/1024), "µs/KiB")
		})
	}
}

// TestScanIsLinear scans each input of BenchInputs at 256 KiB and at four
// times that: a scan that goes quadratic (a loop per keyword over the rest
// of the text, a window that grows with the text) takes sixteen times as
// long, a linear one four. Findings stay within the text.
func TestScanIsLinear(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("scans 25 MiB and times them")
	}
	e := Default()
	fastest := func(s string) time.Duration {
		var best time.Duration
		for i := range 3 {
			start := cputime.Process()
			for _, f := range e.Scan(s) {
				if f.Offset < 0 || f.Offset+f.Length > len(s) {
					t.Fatalf("finding out of bounds %+v", f)
				}
			}
			if d := cputime.Process() - start; i == 0 || d < best {
				best = d
			}
		}
		return best
	}
	small, large := BenchInputs(1<<18), BenchInputs(1<<20)
	for i := range small {
		a, b := fastest(small[i].Text), fastest(large[i].Text)
		t.Logf("%-18s %6.1f µs/KiB at 256 KiB, %6.1f at 1 MiB", small[i].Name,
			float64(a.Microseconds())/256, float64(b.Microseconds())/1024)
		// CPU time is counted in ticks: a few milliseconds are noise.
		if b > 8*a+20*time.Millisecond {
			t.Errorf("%s: %v for 1 MiB, %v for 256 KiB: not linear", small[i].Name, b, a)
		}
	}
}
