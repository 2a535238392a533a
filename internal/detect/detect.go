// Package detect finds secrets, personal data, injection attempts and
// instructions aimed at an agent in the text that passes through toolgate:
// parameters on the way in, results on the way out, and anything written to
// the audit trail. Its rules are data (rules.json, or an operator's file),
// versioned, and every finding names the rule that fired. Patterns are RE2,
// so scanning is linear in the input.
package detect

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	ahocorasick "github.com/BobuSumisu/aho-corasick"
	"github.com/toolgate/toolgate/schemas"
)

// Detector names a family of rules.
type Detector string

// The detectors.
const (
	Secrets          Detector = "secrets"
	PII              Detector = "pii"
	PromptInjection  Detector = "prompt_injection"
	SQLInjection     Detector = "sql_injection"
	CommandInjection Detector = "command_injection"
	PathTraversal    Detector = "path_traversal"
	XSS              Detector = "xss"
)

// All lists every detector.
var All = []Detector{Secrets, PII, PromptInjection, SQLInjection, CommandInjection, PathTraversal, XSS}

// Finding is one match of one rule.
type Finding struct {
	Rule     string   `json:"rule"`
	Detector Detector `json:"detector"`
	// Path is the JSON pointer of the string the match is in ("" for plain text).
	Path string `json:"path,omitempty"`
	// Offset and Length locate the match in that string, in bytes.
	Offset int `json:"offset"`
	Length int `json:"length"`
}

// RuleSet is the document rules are loaded from.
type RuleSet struct {
	Version     string `json:"version"`
	Description string `json:"description,omitempty"`
	Rules       []Rule `json:"rules"`
}

// Rule is one pattern of a detector.
type Rule struct {
	ID          string   `json:"id"`
	Detector    Detector `json:"detector"`
	Pattern     string   `json:"pattern"`
	Description string   `json:"description,omitempty"`
	// Validator confirms a candidate match: luhn, iban, ssn or phone.
	Validator string `json:"validator,omitempty"`
	// Decode is kept for compatibility: every rule also runs on the
	// normalised and decoded forms of a text (see Engine.Scan).
	Decode bool `json:"decode,omitempty"`
	// Keywords are lower-case literals every match contains one of: the
	// rule runs only near their occurrences (a fast prefilter), and on the
	// whole text when it has none.
	Keywords []string `json:"keywords,omitempty"`
	// Also are lower-case literals of which every match also contains one,
	// within reach of its keyword; a keyword with none near is skipped.
	Also []string `json:"also,omitempty"`
	// Anchored says every match begins where one of its keywords begins
	// (after a leading \b): the rule is tried at those places only.
	Anchored bool `json:"anchored,omitempty"`
}

type compiled struct {
	Rule
	re    *regexp.Regexp
	valid func(string) bool
	idx   int
	// at is re anchored at the start, for Anchored rules; wordStart says
	// the pattern begins with \b.
	at        *regexp.Regexp
	wordStart bool
	span      int // maxSpan of the pattern, 0 if unbounded
	// first is firstBytes of the pattern: where an anchored rule can start.
	first *[256]bool
}

// Engine scans text with a rule set. It is safe for concurrent use.
type Engine struct {
	version string
	rules   map[Detector][]compiled
	all     []*compiled
	// trie finds every rule's keywords in one pass; byKeyword maps a
	// keyword's number to the rules it triggers.
	trie      *ahocorasick.Trie
	byKeyword [][]int
	// byAlso maps a keyword's number to the rules it is an Also word of.
	byAlso [][]int
}

//go:embed rules.json
var defaultRules []byte

// DefaultRules returns the shipped rule set document.
func DefaultRules() []byte { return defaultRules }

var shipped = mustLoad(defaultRules)

func mustLoad(b []byte) *Engine {
	e, err := Load(b)
	if err != nil {
		panic(fmt.Sprintf("shipped detector rules: %v", err))
	}
	return e
}

// Default returns the engine of the shipped rules.
func Default() *Engine { return shipped }

// Load compiles a rule set document, checked against its JSON Schema.
func Load(doc []byte) (*Engine, error) {
	fields, err := schemas.Validate(schemas.DetectorRules(), doc)
	if err != nil {
		return nil, fmt.Errorf("detector rules: %w", err)
	}
	if len(fields) > 0 {
		return nil, fmt.Errorf("detector rules: %s at %s", fields[0].Message, fields[0].Location)
	}
	var rs RuleSet
	if err := json.Unmarshal(doc, &rs); err != nil {
		return nil, fmt.Errorf("detector rules: %w", err)
	}
	e := &Engine{version: rs.Version, rules: map[Detector][]compiled{}}
	seen := map[string]bool{}
	for _, r := range rs.Rules {
		if seen[r.ID] {
			return nil, fmt.Errorf("detector rules: duplicate rule id %q", r.ID)
		}
		seen[r.ID] = true
		re, err := regexp.Compile(r.Pattern)
		if err != nil {
			return nil, fmt.Errorf("detector rule %s: %w", r.ID, err)
		}
		c := compiled{Rule: r, re: re}
		if r.Anchored {
			if len(r.Keywords) == 0 {
				return nil, fmt.Errorf("detector rule %s: anchored without keywords", r.ID)
			}
			c.at = regexp.MustCompile(`^(?:` + r.Pattern + `)`)
			c.span = maxSpan(r.Pattern)
			c.first = firstBytes(r.Pattern)
			c.wordStart = strings.HasPrefix(strings.TrimPrefix(r.Pattern, "(?i)"), `\b`)
		}
		if r.Validator != "" {
			if c.valid = validators[r.Validator]; c.valid == nil {
				return nil, fmt.Errorf("detector rule %s: unknown validator %q", r.ID, r.Validator)
			}
		}
		c.idx = len(e.all)
		e.rules[r.Detector] = append(e.rules[r.Detector], c)
		e.all = append(e.all, &c)
	}
	e.buildTrie()
	return e, nil
}

// Version is the rule set's version, reported with every finding.
func (e *Engine) Version() string { return e.version }

// ScanJSON scans every string, key and number of a JSON document, and
// reports credentials by their place (RuleNamedValue, RuleJWKPrivate).
func (e *Engine) ScanJSON(doc []byte, ds ...Detector) ([]Finding, error) {
	v, err := decode(doc)
	if err != nil {
		return nil, err
	}
	var out []Finding
	walk(v, "", false, func(path, s string, named bool) string {
		out = append(out, e.scanValue(path, s, named, ds)...)
		return s
	})
	return out, nil
}

// Redacted is what a redacted match is replaced with.
func Redacted(rule string) string { return "[REDACTED:" + rule + "]" }

// RedactJSON replaces every match of ds in the strings of doc with
// Redacted(rule) and returns the new document and what was found.
func (e *Engine) RedactJSON(doc []byte, ds ...Detector) ([]byte, []Finding, error) {
	return e.rewriteJSON(doc, ds, func(s string, fs []Finding) string { return redact(s, fs) })
}

// EscapeJSON HTML-escapes the strings of doc in which ds fire.
func (e *Engine) EscapeJSON(doc []byte, ds ...Detector) ([]byte, []Finding, error) {
	return e.rewriteJSON(doc, ds, func(s string, _ []Finding) string { return htmlEscaper.Replace(s) })
}

var htmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;")

func (e *Engine) rewriteJSON(doc []byte, ds []Detector, fix func(string, []Finding) string) ([]byte, []Finding, error) {
	v, err := decode(doc)
	if err != nil {
		return nil, nil, err
	}
	var found []Finding
	v = walk(v, "", false, func(path, s string, named bool) string {
		fs := e.scanValue(path, s, named, ds)
		if len(fs) == 0 {
			return s
		}
		found = append(found, fs...)
		return fix(s, fs)
	})
	if len(found) == 0 {
		return doc, nil, nil
	}
	out, err := json.Marshal(v)
	return out, found, err
}

// redact replaces the spans of fs in s, merging overlaps.
func redact(s string, fs []Finding) string {
	sort.Slice(fs, func(i, j int) bool { return fs[i].Offset < fs[j].Offset })
	var b strings.Builder
	pos := 0
	for _, f := range fs {
		end := f.Offset + f.Length
		if end <= pos {
			continue
		}
		if f.Offset > pos {
			b.WriteString(s[pos:f.Offset])
		}
		b.WriteString(Redacted(f.Rule))
		pos = end
	}
	b.WriteString(s[pos:])
	return b.String()
}

func decode(doc []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// visit is called on every string, object key and number of a document and
// returns its replacement. named is set for values that are credentials by
// their place: under a key that says so (password, token, …) or a JWK's
// private members.
type visit func(path, s string, named bool) string

// walk calls fn on every string, key and number of v and replaces each with
// what fn returns: a changed key renames its member (never overwriting
// another), a changed number becomes a string.
func walk(v any, path string, named bool, fn visit) any {
	switch t := v.(type) {
	case string:
		return fn(path, t, named)
	case json.Number:
		if r := fn(path, string(t), named); r != string(t) {
			return r
		}
		return t
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		jwk := isPrivateJWK(t)
		for _, k := range keys {
			p := path + "/" + escapePointer(k)
			x := walk(t[k], p, named || NamedCredential(k) || jwk && jwkPrivate[k], fn)
			nk := fn(p, k, false)
			if nk == k {
				t[k] = x
				continue
			}
			delete(t, k)
			for _, taken := t[nk]; taken; _, taken = t[nk] {
				nk += "'"
			}
			t[nk] = x
		}
	case []any:
		for i, x := range t {
			t[i] = walk(x, fmt.Sprintf("%s/%d", path, i), named, fn)
		}
	}
	return v
}

// Rules that fire on a value's place in a document rather than its text.
const (
	// RuleNamedValue: the value of a member whose name says it is a credential.
	RuleNamedValue = "secret.named_value"
	// RuleJWKPrivate: a private member of a JSON Web Key.
	RuleJWKPrivate = "secret.jwk_private"
)

var credentialNames = map[string]bool{
	"pwd": true, "password": true, "passwd": true, "secret": true, "apikey": true, "token": true,
	"authorization": true, "privatekey": true, "clientsecret": true,
}

// NamedCredential reports whether a member name says its value is a
// credential: pwd, password, passwd, secret, api_key, apikey, token,
// authorization, private_key, client_secret; case, '-' and '_' ignored.
func NamedCredential(key string) bool {
	if len(key) > 32 {
		return false
	}
	k := strings.ToLower(strings.NewReplacer("-", "", "_", "").Replace(key))
	return credentialNames[k]
}

var jwkPrivate = map[string]bool{"d": true, "p": true, "q": true, "dp": true, "dq": true, "qi": true, "k": true}

// isPrivateJWK reports whether m is a JSON Web Key holding private material.
func isPrivateJWK(m map[string]any) bool {
	if _, ok := m["kty"].(string); !ok {
		return false
	}
	_, d := m["d"]
	_, k := m["k"]
	return d || k
}

// scanValue scans one string of a document, adding the finding its place
// implies.
func (e *Engine) scanValue(path, s string, named bool, ds []Detector) []Finding {
	fs := e.Scan(s, ds...)
	if named && s != "" && (len(ds) == 0 || slices.Contains(ds, Secrets)) {
		rule := RuleNamedValue
		if i := strings.LastIndexByte(path, '/'); i >= 0 && jwkPrivate[path[i+1:]] {
			rule = RuleJWKPrivate
		}
		fs = append(fs, Finding{Rule: rule, Detector: Secrets, Offset: 0, Length: len(s)})
	}
	for i := range fs {
		fs[i].Path = path
	}
	return fs
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
