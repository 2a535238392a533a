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
	"sync"

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
	// MaliciousCode finds code a tool's output hands the agent to run that
	// harms the host: piping a download to a shell, wiping the file
	// system, reverse shells, eval of decoded text (seed 000 §3.6).
	MaliciousCode Detector = "malicious_code"
)

// All lists every detector.
var All = []Detector{Secrets, PII, PromptInjection, SQLInjection, CommandInjection, PathTraversal, XSS, MaliciousCode}

// Finding is one match of one rule.
type Finding struct {
	Rule     string   `json:"rule"`
	Detector Detector `json:"detector"`
	// Path is the JSON pointer of the string the match is in ("" for plain text).
	Path string `json:"path,omitempty"`
	// Offset and Length locate the match in that string, in bytes.
	Offset int `json:"offset"`
	Length int `json:"length"`
	// derived marks a match found only in a normalised or decoded form,
	// reported on the whole string.
	derived bool
}

// RuleSet is the document rules are loaded from.
type RuleSet struct {
	Version     string `json:"version"`
	Description string `json:"description,omitempty"`
	Rules       []Rule `json:"rules"`
	// Allow lists matches that are not findings, whichever rule of the
	// detector found them: published sample keys, test card numbers.
	Allow []Allow `json:"allow,omitempty"`
}

// Allow drops the matches of a detector's rules whose text Pattern matches.
type Allow struct {
	Detector    Detector `json:"detector"`
	Pattern     string   `json:"pattern"`
	Description string   `json:"description,omitempty"`
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
	// Allow are patterns of matches that are not findings: placeholders,
	// references to the environment.
	Allow []string `json:"allow,omitempty"`
	// NotNear are lower-case words that, just before a match or in the
	// name of the member holding it, say it is something else (an order
	// number, an ISBN, a timestamp).
	NotNear []string `json:"not_near,omitempty"`
	// NotNamed are lower-case words that, in the name a match follows
	// (the identifier just before it) or in the JSON member holding it,
	// say its value is no credential: a CSRF token, a public token.
	NotNamed []string `json:"not_named,omitempty"`
	// Transformed runs the rule also on the text reversed, unspaced and
	// ROT13-decoded: for shapes that do not occur there by chance.
	Transformed bool `json:"transformed,omitempty"`
	// Joined runs the rule also on the short strings of a JSON object or
	// array joined together: a value split across members is found whole.
	Joined bool `json:"joined,omitempty"`
	// Discussed drops a match quoted in a text that discusses the attack.
	Discussed bool `json:"discussed,omitempty"`
	// Lines says every match begins at the start of a line ((?m)^) and
	// ends on it: the rule is tried once at the start of each line that
	// holds one of its keywords, not on windows around them.
	Lines bool `json:"lines,omitempty"`
	// Keyed makes the keywords context words that a JSON member name may
	// also hold: the rule then runs on the whole of that member's value.
	Keyed bool `json:"keyed,omitempty"`
}

type compiled struct {
	Rule
	re    *regexp.Regexp
	valid func(string) bool
	idx   int
	// at is re anchored at the start, for Anchored rules; wordStart says
	// the pattern begins with \b (which the matcher, given the text from
	// a place on, cannot check).
	at        *regexp.Regexp
	wordStart bool
	// underscore says the pattern begins with (?:\b|_): it may also
	// begin inside a word, at an underscore (DB_PASSWORD).
	underscore bool
	span       int // maxSpan of the pattern, 0 if unbounded
	// witness is, for an unbounded pattern, how far a match must reach
	// for the matcher to have seen one (witnessSpan), 0 if unknown.
	witness int
	// first is firstBytes of the pattern: where an anchored rule can start.
	first *[256]bool
	// tail is the run every match ends in (tailRun), for anchored rules.
	tail  *tailRun
	allow []*regexp.Regexp
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
	// allow holds each detector's allow-list (RuleSet.Allow).
	allow map[Detector][]*regexp.Regexp
	// shapes and joiner are engines of the Transformed and the Joined
	// rules: the forms they scan are many, so their tries are small.
	shapes, joiner *Engine
	ids            map[string]*compiled
	// hints holds, by keyword number, the shape forms its presence
	// hints at (hintReversed, …).
	hints []uint8
	// scratch pools the per-rule state of scans (see scanHints).
	scratch *sync.Pool
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
		if r.Anchored || r.Lines {
			if len(r.Keywords) == 0 {
				return nil, fmt.Errorf("detector rule %s: anchored without keywords", r.ID)
			}
			c.at = regexp.MustCompile(`^(?:` + r.Pattern + `)`)
			c.span = maxSpan(r.Pattern)
			if c.span == 0 {
				c.witness = witnessSpan(r.Pattern)
			}
			c.tail = tailOf(r.Pattern)
		}
		if r.Anchored && !r.Lines {
			c.first = firstBytes(r.Pattern)
			body := strings.TrimPrefix(r.Pattern, "(?i)")
			c.underscore = strings.HasPrefix(body, `(?:\b|_)`)
			c.wordStart = strings.HasPrefix(body, `\b`) || c.underscore
		}
		if r.Lines && slices.ContainsFunc(r.Keywords, func(k string) bool { return strings.ContainsAny(k, "\r\n") }) {
			return nil, fmt.Errorf("detector rule %s: a keyword of a rule of lines holds a line break", r.ID)
		}
		if r.Validator != "" {
			if c.valid = validators[r.Validator]; c.valid == nil {
				return nil, fmt.Errorf("detector rule %s: unknown validator %q", r.ID, r.Validator)
			}
		}
		for _, a := range r.Allow {
			re, err := regexp.Compile(a)
			if err != nil {
				return nil, fmt.Errorf("detector rule %s: allow: %w", r.ID, err)
			}
			c.allow = append(c.allow, re)
		}
		e.add(c)
	}
	e.allow = map[Detector][]*regexp.Regexp{}
	for _, a := range rs.Allow {
		re, err := regexp.Compile(a.Pattern)
		if err != nil {
			return nil, fmt.Errorf("detector allow-list: %w", err)
		}
		e.allow[a.Detector] = append(e.allow[a.Detector], re)
	}
	e.shapes = e.sub(func(c *compiled) bool { return c.Transformed })
	e.joiner = e.sub(func(c *compiled) bool { return c.Joined })
	e.buildTrie()
	return e, nil
}

func (e *Engine) add(c compiled) {
	if e.ids == nil {
		e.ids = map[string]*compiled{}
		e.scratch = &sync.Pool{New: func() any { return new(scratch) }}
	}
	c.idx = len(e.all)
	e.ids[c.ID] = &c
	e.rules[c.Detector] = append(e.rules[c.Detector], c)
	e.all = append(e.all, &c)
}

// sub returns an engine of the rules keep selects, sharing the allow-lists,
// or nil when there are none.
func (e *Engine) sub(keep func(*compiled) bool) *Engine {
	s := &Engine{version: e.version, rules: map[Detector][]compiled{}, allow: e.allow}
	for _, c := range e.all {
		if keep(c) {
			s.add(*c)
		}
	}
	if len(s.all) == 0 {
		return nil
	}
	if keep(&compiled{Rule: Rule{Joined: true}}) {
		// Joined parts are read in the shapes too: literals written one
		// after another across items ("ghp_…" "…") join there.
		s.shapes = s.sub(func(c *compiled) bool { return c.Transformed && c.Joined })
	}
	s.buildTrie()
	return s
}

// Strict returns an engine of the same rules without the rule set's
// allow-lists: published sample keys and test card numbers are found like
// any others. Where text is kept rather than shown to a caller (the audit
// trail), redacting a look-alike costs nothing.
func (e *Engine) Strict() *Engine {
	s := *e
	s.allow = nil
	if e.shapes != nil {
		sh := *e.shapes
		sh.allow = nil
		s.shapes = &sh
	}
	if e.joiner != nil {
		j := *e.joiner
		j.allow = nil
		if j.shapes != nil {
			js := *j.shapes
			js.allow = nil
			j.shapes = &js
		}
		s.joiner = &j
	}
	return &s
}

var strict = shipped.Strict()

// DefaultStrict is Default without its allow-lists (see Strict).
func DefaultStrict() *Engine { return strict }

// Version is the rule set's version, reported with every finding.
func (e *Engine) Version() string { return e.version }

// Redacted is what a redacted match is replaced with.
func Redacted(rule string) string { return "[REDACTED:" + rule + "]" }

// RedactJSON replaces every match of ds in the strings of doc with
// Redacted(rule) and returns the new document and what was found.
func (e *Engine) RedactJSON(doc []byte, ds ...Detector) ([]byte, []Finding, error) {
	return e.rewriteJSON(doc, ds, func(s string, fs []Finding) string { return redact(s, fs) })
}

// EscapeJSON HTML-escapes the strings of doc in which ds fire.
func (e *Engine) EscapeJSON(doc []byte, ds ...Detector) ([]byte, []Finding, error) {
	return e.rewriteJSON(doc, ds, escape)
}

// RedactDoc is RedactJSON of d, which it rewrites when it finds something.
func (e *Engine) RedactDoc(d *Doc, ds ...Detector) ([]Finding, error) {
	return e.rewriteDoc(d, ds, func(s string, fs []Finding) string { return redact(s, fs) })
}

// EscapeDoc is EscapeJSON of d, which it rewrites when it finds something.
func (e *Engine) EscapeDoc(d *Doc, ds ...Detector) ([]Finding, error) {
	return e.rewriteDoc(d, ds, escape)
}

func escape(s string, _ []Finding) string { return htmlEscaper.Replace(s) }

var htmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;")

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

var credentialNames = map[string]bool{
	"pwd": true, "password": true, "passwd": true, "secret": true, "apikey": true, "token": true,
	"authorization": true, "privatekey": true, "clientsecret": true, "passphrase": true, "credential": true,
	"credentials": true, "proxyauthorization": true, "identitytoken": true, "xapikey": true, "cookie": true, "setcookie": true,
}

// credentialSuffixes end member names whose values are credentials
// (db_password, GITHUB_ACCESS_TOKEN, AccountKey); names ending in plain
// "token" are left out, since page and continuation tokens are not secrets.
var credentialSuffixes = []string{
	"password", "passwd", "secret", "apikey", "accesstoken", "refreshtoken", "authtoken", "apitoken",
	"sessiontoken", "bearertoken", "secretkey", "privatekey", "clientsecret", "accountkey", "sharedaccesskey",
	"connectionstring", "passphrase", "signingkey", "encryptionkey", "masterkey", "sastoken", "webhooksecret",
	"secretaccesskey", "bottoken", "authkey", "licensekey",
}

// NamedCredential reports whether a member name says its value is a
// credential: pwd, password, passwd, secret, api_key, apikey, token,
// authorization, private_key, client_secret, passphrase, credentials, and
// names ending in password, secret, api_key, access_token, secret_key,
// account_key and the like; case, '-' and '_' ignored.
func NamedCredential(key string) bool {
	if len(key) > 48 {
		return false
	}
	k := normName(key)
	if credentialNames[k] {
		return true
	}
	for _, suf := range credentialSuffixes {
		if strings.HasSuffix(k, strings.ToLower(suf)) {
			return true
		}
	}
	return false
}

var nameSeparators = strings.NewReplacer("-", "", "_", "", ".", "", " ", "")

func normName(key string) string { return strings.ToLower(nameSeparators.Replace(key)) }

// credentialCollections name members whose own member names are
// credentials: {"tokens": {"<token>": {...}}}.
var credentialCollections = map[string]bool{
	"tokens": true, "apikeys": true, "keys": true, "secrets": true, "credentials": true, "sessions": true,
	"sessionids": true, "passwords": true, "accesstokens": true, "authtokens": true, "apitokens": true,
	"cookies": true, "accesskeys": true, "bykey": true, "bytoken": true,
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

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
