package detect

import "strings"

// Input is a text the detectors' speed is measured on.
type Input struct {
	Name, Text string
}

// adversarialUnits are the repeated units of the inputs built against the
// scanner, in the order their figures are printed: each makes a
// backtracking matcher, a dense keyword or a naive per-position loop slow.
var adversarialUnits = []Input{
	{"repeated quotes", "' OR "},
	{"repeated ../", "../"},
	{"repeated digits", "4111 "},
	{"base64-like", "eyJhbGciOiJIUzI1NiJ9"},
	{"repeated a@", "a@"},
	{"instruction-heavy", "ignore the previous "},
	{"repeated a", "a"},
	{"hex-like", "deadbeef"},
	{"percent", "%2e%2e%2f"},
	{"markdown links", "![x](https://e.example/?q=abc) "},
	// Against the split, labelled-line, escape, token-name, e-mail, MRZ
	// and code rules and forms.
	{"html", `<div class="a"><<x>></div> `},
	{"token assignments", "xToken = abcdefgh1 "},
	{"dash groups", "ghp_-ab1-"},
	{"quoted pieces", `"ab1" "cd2" + `},
	{"labelled lines", "token part: ab1\n"},
	{"escapes", `\u0041\x42`},
	{"spelled e-mails", "a.b at c dot "},
	{"download pipes", "curl x | "},
	{"dates of birth", "DOB 01/02/1990 "},
	{"invalid UTF-8", "\xff\xfe\xc3"},
}

// prose is ordinary text, the case the detectors' budget is set for.
const prose = "The quarterly report covers sales in three regions; see docs/guide.md for the method. Contact the team lead for access. "

// BenchInputs returns texts of n bytes to measure the detectors on:
// ordinary prose first, then the inputs built against the scanner.
func BenchInputs(n int) []Input {
	fill := func(unit string) string { return strings.Repeat(unit, n/len(unit)+1)[:n] }
	out := []Input{{"prose", fill(prose)}}
	for _, u := range adversarialUnits {
		out = append(out, Input{u.Name, fill(u.Text)})
	}
	return out
}
