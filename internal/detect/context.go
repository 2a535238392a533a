package detect

import (
	"math"
	"regexp"
	"sort"
	"strings"
)

// Scan returns the findings of detectors ds (all when none) in s, ordered by
// offset. Offsets are in s; a match found only in a normalised, decoded or
// transformed form of s (see normalise and shapeForms) is reported on the
// whole of s.
func (e *Engine) Scan(s string, ds ...Detector) []Finding { return e.scan(s, "", ds) }

// scan is Scan of a string found under the member name key, which gives
// context to rules with NotNear words.
func (e *Engine) scan(s, key string, ds []Detector) []Finding {
	out := e.keep(s, key, e.scanRaw(s, ds))
	var seen map[string]bool
	whole := func(eng *Engine, forms []string) {
		for _, form := range forms {
			for _, f := range eng.keep(form, key, eng.scanRaw(form, ds)) {
				if seen == nil {
					seen = map[string]bool{}
					for _, g := range out {
						seen[g.Rule] = true
					}
				}
				if !seen[f.Rule] {
					seen[f.Rule] = true
					out = append(out, Finding{Rule: f.Rule, Detector: f.Detector, Offset: 0, Length: len(s)})
				}
			}
		}
	}
	if n, ok := normalise(s); ok {
		whole(e, n)
	}
	if e.shapes != nil && e.shapes.serves(ds) {
		whole(e.shapes, shapeForms(s))
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Offset < out[j].Offset })
	return out
}

// serves reports whether e has rules of one of ds (all when none).
func (e *Engine) serves(ds []Detector) bool {
	if len(ds) == 0 {
		return true
	}
	for _, d := range ds {
		if len(e.rules[d]) > 0 {
			return true
		}
	}
	return false
}

// keep drops the findings that context says are something else: allowed
// by the rule or its detector's allow-list, next to a NotNear word, or a
// quoted mention in a text that discusses the attack.
func (e *Engine) keep(s, key string, fs []Finding) []Finding {
	if len(fs) == 0 {
		return fs
	}
	out := fs[:0]
	for _, f := range fs {
		c := e.byID(f.Rule)
		m := s[f.Offset : f.Offset+f.Length]
		if c != nil && (matchesAny(c.allow, m) || matchesAny(e.allow[c.Detector], m) ||
			len(c.NotNear) > 0 && notNear(s, f.Offset, key, c.NotNear) ||
			c.Discussed && discussed(s, f.Offset)) {
			continue
		}
		out = append(out, f)
	}
	return out
}

func (e *Engine) byID(id string) *compiled { return e.ids[id] }

func matchesAny(res []*regexp.Regexp, s string) bool {
	for _, re := range res {
		if re.MatchString(s) {
			return true
		}
	}
	return false
}

// notNear reports whether one of words occurs in the 40 bytes before at or
// in the member name key.
func notNear(s string, at int, key string, words []string) bool {
	before := asciiLower(s[max(0, at-40):at])
	k := asciiLower(key)
	for _, w := range words {
		if strings.Contains(before, w) || k != "" && strings.Contains(k, w) {
			return true
		}
	}
	return false
}

// discussionCues are words of texts that explain an attack rather than
// carry one: documentation, advisories, papers, training material.
var discussionCues = []string{
	"injection", "attack", "jailbreak", "malicious", "adversar", "owasp", "for example", "e.g.",
	"such as", "classifier", "defen", "mitigat", "payload", "phrases", "markers", "exploit",
}

// discussed reports whether the match at is quoted or introduced as an
// example, in a text that discusses attacks.
func discussed(s string, at int) bool {
	before := asciiLower(s[max(0, at-24):at])
	quoted := false
	for _, q := range []string{"\"", "'", "`", "“", "‘", "«", "such as", "like ", "e.g.", "example:", "called"} {
		if strings.Contains(before, q) {
			quoted = true
			break
		}
	}
	if !quoted {
		return false
	}
	l := asciiLower(s)
	n := 0
	for _, c := range discussionCues {
		if strings.Contains(l, c) {
			n++
		}
	}
	return n >= 1
}

// placeholders are values of credential-named members that hold no
// credential: empty markers, template and environment references.
var placeholders = regexp.MustCompile(`(?i)^(?:\s*|[*x.#-]+|<[^<>]*>|\$\{[^{}]*\}|\$[A-Z_][A-Z0-9_]*|\{\{.*\}\}|%\(?[a-z_]*\)?s|` +
	`(?:env|vault|secret|ssm|op|keyvault|gcp-secret|aws-secret)s?:[A-Za-z0-9_/.:-]*|` +
	`changeme|change_me|replace_?me|placeholder|redacted|\[redacted[^\]]*\]|none|null|nil|undefined|todo|tbd|` +
	`your[_ -].*|(?:my|some|example|sample|dummy|fake|test)[_ -]?(?:password|secret|token|key|api[_ -]?key)?|` +
	`password|secret|token|true|false|[0-9]{1,6}|.*EXAMPLE.*)$`)

// placeholder reports whether a credential-named member's value is a
// placeholder, or allowed by the secrets allow-list.
func (e *Engine) placeholder(s string) bool {
	return placeholders.MatchString(s) || matchesAny(e.allow[Secrets], s)
}

// shannon is the entropy of s in bits per byte.
func shannon(s string) float64 {
	var n [256]int
	for i := 0; i < len(s); i++ {
		n[s[i]]++
	}
	h := 0.0
	for _, c := range n {
		if c > 0 {
			p := float64(c) / float64(len(s))
			h -= p * math.Log2(p)
		}
	}
	return h
}
