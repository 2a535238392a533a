package detect

import (
	"strings"
	"testing"
)

// benchInputs are 1 MiB texts: ordinary prose and inputs built to make
// backtracking regular expressions or a naive scanner slow. They mirror
// internal/bench's detector inputs.
func benchInputs() map[string]string {
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
		// Against the split, labelled-line, escape, token-name, e-mail,
		// MRZ and code rules and forms.
		"html":              fill(`<div class="a"><<x>></div> `),
		"token assignments": fill("xToken = abcdefgh1 "),
		"dash groups":       fill("ghp_-ab1-"),
		"quoted pieces":     fill(`"ab1" "cd2" + `),
		"labelled lines":    fill("token part: ab1\n"),
		"escapes":           fill(`\u0041\x42`),
		"spelled e-mails":   fill("a.b at c dot "),
		"download pipes":    fill("curl x | "),
		"dates of birth":    fill("DOB 01/02/1990 "),
	}
}

// BenchmarkDetectors reports µs per KiB of all detectors on each input.
func BenchmarkDetectors(b *testing.B) {
	e := Default()
	for name, s := range benchInputs() {
		b.Run(strings.ReplaceAll(name, " ", "_"), func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			for b.Loop() {
				e.Scan(s)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/float64(len(s)/1024), "µs/KiB")
		})
	}
}
