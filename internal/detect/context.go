package detect

import (
	"math"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode"
)

// Scan returns the findings of detectors ds (all when none) in s, ordered by
// offset. Offsets are in s; a match found only in a normalised, decoded or
// transformed form of s (see normalise and shapeForms) is reported on the
// whole of s.
func (e *Engine) Scan(s string, ds ...Detector) []Finding { return e.scan(s, "", ds) }

// scan is Scan of a string found under the member name key, which gives
// context to rules with NotNear words.
func (e *Engine) scan(s, key string, ds []Detector) []Finding {
	raw, hints := e.scanHints(s, ds)
	out := e.keep(s, key, raw)
	if key != "" {
		out = append(out, e.keep(s, key, e.scanKeyed(s, key, ds, out))...)
	}
	var seen map[string]bool
	if n, ok := normalise(s); ok {
		for _, form := range n {
			for _, f := range e.keep(form, key, e.scanRaw(form, ds)) {
				if seen == nil {
					seen = map[string]bool{}
					for _, g := range out {
						seen[g.Rule] = true
					}
				}
				if !seen[f.Rule] {
					seen[f.Rule] = true
					out = append(out, Finding{Rule: f.Rule, Detector: f.Detector, Offset: 0, Length: len(s), derived: true})
				}
			}
		}
	}
	if e.shapes != nil && e.shapes.serves(ds) {
		for _, form := range shapeForms(s, hints) {
			for _, f := range e.shapes.keep(form.s, key, e.shapes.scanRaw(form.s, ds)) {
				a, b := form.span(f.Offset, f.Offset+f.Length)
				if !slices.ContainsFunc(out, func(g Finding) bool {
					return g.Rule == f.Rule && g.Offset <= a && b <= g.Offset+g.Length
				}) {
					out = append(out, Finding{Rule: f.Rule, Detector: f.Detector, Offset: a, Length: b - a, derived: true})
				}
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Offset < out[j].Offset })
	return out
}

// scanKeyed runs, on the whole of s, the Keyed rules of ds that the member
// name key gives context to and that have not already fired.
func (e *Engine) scanKeyed(s, key string, ds []Detector, have []Finding) []Finding {
	var buf [8]string
	words := keyWords(buf[:0], key)
	var out []Finding
	for _, c := range e.all {
		if !c.Keyed || len(ds) > 0 && !slices.Contains(ds, c.Detector) ||
			slices.ContainsFunc(have, func(f Finding) bool { return f.Rule == c.ID }) ||
			!slices.ContainsFunc(c.Keywords, func(kw string) bool { return namesContext(words, kw) }) {
			continue
		}
		for _, loc := range c.re.FindAllStringIndex(s, MaxMatchesPerRule) {
			if c.valid == nil || c.valid(s[loc[0]:loc[1]]) {
				out = append(out, Finding{Rule: c.ID, Detector: c.Detector, Offset: loc[0], Length: loc[1] - loc[0]})
			}
		}
	}
	return out
}

// keyWords appends to out a member name's lower-case words: phoneNumber,
// phone_number and phone-number give phone and number. A word already in
// lower case is a slice of key, so a caller's array holds the words of a
// short name without allocating: every value of a document is scanned so.
func keyWords(out []string, key string) []string {
	start := -1     // where the word being read starts in key
	folded := false // it has an upper-case letter to lower
	flush := func(end int) {
		if start >= 0 {
			w := key[start:end]
			if folded {
				w = strings.Map(lowerUpper, w)
			}
			out = append(out, w)
		}
		start, folded = -1, false
	}
	prevLower := false
	for i, r := range key {
		switch {
		case unicode.IsUpper(r):
			if prevLower {
				flush(i)
			}
			if start < 0 {
				start = i
			}
			folded, prevLower = true, false
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			if start < 0 {
				start = i
			}
			prevLower = true
		default:
			flush(i)
			prevLower = false
		}
	}
	flush(len(key))
	return out
}

// lowerUpper lowers an upper-case letter and leaves any other rune (a
// title-case letter included) as it is.
func lowerUpper(r rune) rune {
	if unicode.IsUpper(r) {
		return unicode.ToLower(r)
	}
	return r
}

// namesContext reports whether a context word kw names one of a member
// name's words: the word itself, or its start for words of four letters
// or more (phone in phonenumber; not tel in hotel).
func namesContext(words []string, kw string) bool {
	kw = strings.Trim(kw, " .:")
	for _, w := range words {
		if w == kw || len(kw) >= 3 && strings.HasPrefix(w, kw) {
			return true
		}
	}
	return strings.Contains(strings.Join(words, " "), kw) && strings.Contains(kw, " ")
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
			len(c.NotNamed) > 0 && notNamed(s, f.Offset, key, c.NotNamed) ||
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

// notNamed reports whether one of words occurs in the identifier that ends
// where the match begins (authenticity_token, publicToken, csrf-token) or in
// the member name key.
func notNamed(s string, at int, key string, words []string) bool {
	from := at
	for from > 0 && at-from < 64 && (isWord(s[from-1]) || s[from-1] == '-' || s[from-1] == '.') {
		from--
	}
	name, k := asciiLower(s[from:at]), asciiLower(key)
	for _, w := range words {
		if strings.Contains(name, w) || strings.Contains(k, w) {
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
	"untrusted", "risky", "dangerous", "safeguard", "webshell", "yara", "detection rule",
}

// discussed reports whether the match at is quoted (inside backticks or
// double quotes opened earlier on its line) or introduced as an example,
// in a text that discusses attacks.
func discussed(s string, at int) bool {
	from := max(0, at-160)
	if i := strings.LastIndexByte(s[from:at], '\n'); i >= 0 {
		from += i + 1
	}
	before := asciiLower(s[from:at])
	quoted := strings.Count(before, "`")%2 == 1 || strings.Count(before, `"`)%2 == 1 ||
		strings.Count(before, "“") > strings.Count(before, "”") || strings.Count(before, "'")%2 == 1 && strings.Contains(before, " '")
	for _, q := range []string{"such as", "like ", "e.g.", "for example", "example:", "called", "known as"} {
		if quoted {
			break
		}
		quoted = strings.Contains(before, q)
	}
	if !quoted {
		return false
	}
	l := asciiLower(s)
	for _, c := range discussionCues {
		if strings.Contains(l, c) {
			return true
		}
	}
	return false
}

// placeholders are values of credential-named members that hold no
// credential: empty markers, template and environment references.
var placeholders = regexp.MustCompile(`(?i)^(?:\s*|[*x.#-]+|<[^<>]*>|\$\{[^{}]*\}|\$[A-Z_][A-Z0-9_]*|\{\{.*\}\}|%\(?[a-z_]*\)?s|` +
	`(?:env|vault|secret|ssm|op|keyvault|gcp-secret|aws-secret)s?:[A-Za-z0-9_/.:-]*|` +
	`changeme|change_me|replace_?me|placeholder|redacted|\[redacted[^\]]*\]|none|null|nil|undefined|todo|tbd|` +
	`your[_ -].*|(?:my|some|example|sample|dummy|fake|test)[_ -]?(?:password|secret|token|key|api[_ -]?key)?|` +
	`password|secret|token|true|false|[0-9]{1,6})$`)

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
