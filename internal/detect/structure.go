package detect

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Bounds on the structural checks of a JSON document, so that their cost
// stays proportional to the document.
const (
	// maxPart is the longest string joined with its siblings: a secret
	// is split into short pieces; long texts are scanned on their own.
	maxPart = 256
	// maxJoined bounds the joined text of one object or array.
	maxJoined = 4 << 10
	// minByteArray is the shortest array of small integers read as bytes.
	minByteArray = 8
)

// Rules that fire on a value's place in a document rather than its text.
const (
	// RuleNamedValue: the value of a member whose name says it is a credential.
	RuleNamedValue = "secret.named_value"
	// RuleJWKPrivate: a private member of a JSON Web Key.
	RuleJWKPrivate = "secret.jwk_private"
	// RuleNamedKey: a member name that is itself a credential, under a
	// member whose name says so ({"tokens": {"<token>": …}}), or shaped
	// as user:password.
	RuleNamedKey = "secret.named_key"
)

// ScanJSON scans every string, key and number of a JSON document, and
// reports credentials by their place (RuleNamedValue, RuleJWKPrivate,
// RuleNamedKey), secrets split across the strings of an object or array,
// and arrays of byte values that spell one. A finding's Path never holds
// the text found: a member name that is a secret appears in it redacted.
func (e *Engine) ScanJSON(doc []byte, ds ...Detector) ([]Finding, error) {
	return e.ScanDoc(NewDoc(doc), ds...)
}

// Doc is a JSON document read by several passes (ScanDoc, RedactDoc,
// EscapeDoc): decoded once, and again only after a pass rewrote it.
type Doc struct {
	raw []byte
	v   any // raw decoded, once a pass needed it
}

// NewDoc is the document raw, not yet decoded.
func NewDoc(raw []byte) *Doc { return &Doc{raw: raw} }

// NewDecodedDoc is the document raw with its tree v, as a caller that
// decoded raw already (or encoded raw from v) holds it, decoded as decode
// does (UseNumber): the first pass need not decode raw again.
func NewDecodedDoc(raw []byte, v any) *Doc { return &Doc{raw: raw, v: v} }

// Bytes is the document as the last pass left it.
func (d *Doc) Bytes() []byte { return d.raw }

// tree is the decoded document. A walk that finds nothing leaves it as it
// was, so the next pass reads the same tree.
func (d *Doc) tree() (any, error) {
	if d.v != nil {
		return d.v, nil
	}
	v, err := decode(d.raw)
	if err != nil {
		return nil, err
	}
	d.v = v
	return v, nil
}

// ScanDoc is ScanJSON of d.
func (e *Engine) ScanDoc(d *Doc, ds ...Detector) ([]Finding, error) {
	v, err := d.tree()
	if err != nil {
		return nil, err
	}
	w := walker{e: e, ds: ds}
	w.value(v, "", false, "")
	return w.found, nil
}

func (e *Engine) rewriteJSON(doc []byte, ds []Detector, fix func(string, []Finding) string) ([]byte, []Finding, error) {
	d := NewDoc(doc)
	found, err := e.rewriteDoc(d, ds, fix)
	return d.raw, found, err
}

// rewriteDoc walks d with fix; when it found something, d becomes the
// rewritten document, decoded anew by the pass after.
func (e *Engine) rewriteDoc(d *Doc, ds []Detector, fix func(string, []Finding) string) ([]Finding, error) {
	v, err := d.tree()
	if err != nil {
		return nil, err
	}
	w := walker{e: e, ds: ds, fix: fix}
	v = w.value(v, "", false, "")
	if len(w.found) == 0 {
		return nil, nil
	}
	out, err := json.Marshal(v)
	if err != nil {
		return w.found, err
	}
	d.raw, d.v = out, nil
	return w.found, nil
}

// walker scans a decoded document and, when fix is set, replaces what it
// finds with what fix returns.
type walker struct {
	e     *Engine
	ds    []Detector
	fix   func(string, []Finding) string
	found []Finding
	// keys caches what member names hold: the rows of a document repeat
	// the same few names. A small document's are scanned as they come
	// (nkeys counts them), without a map.
	keys  map[keyPlace]keyScan
	nkeys int
}

// uncachedKeys is how many member names a walk scans before it caches
// them.
const uncachedKeys = 16

type keyPlace struct {
	name       string
	collection bool
}

type keyScan struct {
	fs   []Finding
	safe string
}

// key scans a member name once per walk.
func (w *walker) key(k string, collection bool) ([]Finding, string) {
	p := keyPlace{k, collection}
	ks, ok := w.keys[p]
	if !ok {
		ks = keyScan{fs: w.e.scanKey(k, collection, w.ds), safe: w.e.safeKey(k, collection)}
		if w.nkeys++; w.nkeys > uncachedKeys && len(w.keys) < 4096 {
			if w.keys == nil {
				w.keys = map[keyPlace]keyScan{}
			}
			w.keys[p] = ks
		}
	}
	return slices.Clone(ks.fs), ks.safe
}

func (w *walker) wants(d Detector) bool { return len(w.ds) == 0 || slices.Contains(w.ds, d) }

// value scans v, found at path under the member name key, and returns its
// replacement. named says v is a credential by its place.
func (w *walker) value(v any, path string, named bool, key string) any {
	switch t := v.(type) {
	case string:
		// v itself when unchanged: a new interface would allocate.
		if r := w.text(path, t, named, key); r != t {
			return r
		}
		return v
	case json.Number:
		if r := w.text(path, string(t), named, key); r != string(t) {
			return r
		}
		return v
	case map[string]any:
		return w.object(t, path, named, key)
	case []any:
		return w.array(t, path, named, key)
	}
	return v
}

func (w *walker) text(path, s string, named bool, key string) string {
	fs := w.e.scanValue(path, s, named, key, w.ds)
	if len(fs) == 0 {
		return s
	}
	w.found = append(w.found, fs...)
	if w.fix == nil {
		return s
	}
	return w.fix(s, fs)
}

func (w *walker) object(t map[string]any, path string, named bool, key string) any {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	jwk := isPrivateJWK(t)
	collection := credentialCollections[normName(key)]
	var parts []part
	for _, k := range positional(keys) {
		if s, ok := partOf(t[k], false); ok || cardPiece(k, t[k], &s) {
			parts = append(parts, part{s: s, set: setter(t, k)})
		}
	}
	after := w.joined(path, key, parts, w.ds)
	for _, k := range keys {
		kfs, safe := w.key(k, collection)
		p := path + "/" + escapePointer(safe)
		for i := range kfs {
			kfs[i].Path = p
		}
		w.found = append(w.found, kfs...)
		x := w.value(t[k], p, named || NamedCredential(k) || jwk && jwkPrivate[k] || authValue(k, t[k]), k)
		nk := k
		if w.fix != nil && len(kfs) > 0 {
			nk = w.fix(k, kfs)
		}
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
	after()
	return t
}

func (w *walker) array(t []any, path string, named bool, key string) any {
	if b, ok := byteArray(t); ok && (w.wants(Secrets) || w.wants(PII)) {
		var fs []Finding
		for _, f := range w.e.scan(b, key, w.ds) {
			fs = append(fs, Finding{Rule: f.Rule, Detector: f.Detector, Path: path, Offset: 0, Length: 0})
		}
		if len(fs) > 0 {
			w.found = append(w.found, fs...)
			if w.fix != nil {
				return Redacted(fs[0].Rule)
			}
			return t
		}
	}
	var parts []part
	for i, x := range t {
		if s, ok := partOf(x, true); ok {
			parts = append(parts, part{s: s, set: setter(t, i)})
		}
	}
	after := w.joined(path, key, parts, w.ds)
	columns := w.columns(t, path)
	for i, x := range t {
		t[i] = w.value(x, fmt.Sprintf("%s/%d", path, i), named, key)
	}
	after()
	columns()
	return t
}

// columns joins, for an array of objects, each member's strings down the
// items (a secret split across rows: {"k": …, "v": piece} twice) and scans
// them for secrets. Personal-data rules are left out: a column of short
// numbers joined would pass a checksum by chance.
func (w *walker) columns(t []any, path string) func() {
	nothing := func() {}
	if !w.wants(Secrets) || len(t) < 2 || w.e.joiner == nil {
		return nothing
	}
	cols := map[string][]part{}
	for _, x := range t {
		m, ok := x.(map[string]any)
		if !ok {
			return nothing
		}
		for k, v := range m {
			if s, ok := v.(string); ok && len(s) >= 4 && len(s) <= maxPart {
				cols[k] = append(cols[k], part{s: s, set: setter(m, k)})
			}
		}
	}
	names := make([]string, 0, len(cols))
	for k, ps := range cols {
		if len(ps) >= 2 {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	var afters []func()
	for _, k := range names {
		afters = append(afters, w.joined(path, k, cols[k], []Detector{Secrets}))
	}
	return func() {
		for _, f := range afters {
			f()
		}
	}
}

// part is a short string of an object or array, with the means to
// replace it once its container has been walked.
type part struct {
	s   string
	set func(string)
}

// partOf returns the string v contributes to its container's joined text:
// a string, or the one string of an object with a single member. Members
// of an object join only as fragments (no blanks, or very short): texts
// side by side are not pieces of one value; items of an array, lines, are.
func partOf(v any, inArray bool) (string, bool) {
	switch t := v.(type) {
	case string:
		// A PEM block's boundary lines are pieces of the block they open
		// or close, whatever their blanks.
		pem := strings.HasPrefix(t, "-----BEGIN ") || strings.HasPrefix(t, "-----END ")
		return t, len(t) <= maxPart && (inArray || pem || len(t) <= 24 || !strings.ContainsAny(t, " \t\n\r"))
	case map[string]any:
		if len(t) != 1 {
			return "", false
		}
		for _, x := range t {
			if s, ok := x.(string); ok && len(s) <= maxPart {
				return s, true
			}
		}
	}
	return "", false
}

// cardPiece reports whether v is a group of a card number sent as a JSON
// number under a name that says so ({"cc1": 4539, "cc2": 1478, …}), and
// sets *s to its digits.
func cardPiece(k string, v any, s *string) bool {
	n, ok := v.(json.Number)
	if !ok || len(n) > 6 || strings.ContainsAny(string(n), ".-eE+") {
		return false
	}
	var buf [8]string
	for _, w := range keyWords(buf[:0], k) {
		w = strings.TrimRight(w, "0123456789")
		if w == "cc" || w == "card" || w == "pan" || w == "ccnum" || w == "cardnumber" {
			*s = string(n)
			return true
		}
	}
	return false
}

func setter[K comparable](c any, k K) func(string) {
	return func(r string) {
		switch t := c.(type) {
		case map[string]any:
			kk := any(k).(string)
			if m, ok := t[kk].(map[string]any); ok {
				for mk := range m {
					m[mk] = r
				}
				return
			}
			if _, ok := t[kk]; ok {
				t[kk] = r
			}
		case []any:
			i := any(k).(int)
			if m, ok := t[i].(map[string]any); ok {
				for mk := range m {
					m[mk] = r
				}
				return
			}
			t[i] = r
		}
	}
}

// joined scans the parts of a container joined together, in order, and
// records what is found across two parts or more (what lies within one is
// found when that part is scanned). It returns a function that, once the
// container has been walked, redacts the parts such a finding touches.
func (w *walker) joined(path, key string, parts []part, ds []Detector) func() {
	nothing := func() {}
	if w.e.joiner == nil || len(parts) < 2 {
		return nothing
	}
	var b strings.Builder
	ends := make([]int, len(parts))
	for i, p := range parts {
		if b.Len()+len(p.s) > maxJoined {
			parts, ends = parts[:i], ends[:i]
			break
		}
		b.WriteString(p.s)
		ends[i] = b.Len()
	}
	if len(parts) < 2 {
		return nothing
	}
	s := b.String()
	var hit []Finding
	touched := map[int]string{}
	for _, f := range w.e.joiner.scan(s, key, ds) {
		first := sort.SearchInts(ends, f.Offset+1)
		last := sort.SearchInts(ends, f.Offset+f.Length)
		if f.derived && w.e.joiner.inOnePart(parts, f.Rule, key, ds) {
			continue
		}
		if first >= last {
			continue // within one part
		}
		// A token pattern runs on into the next part when it can: drop
		// trailing parts while the rule still fires across the rest. Not
		// for a rule whose match may run to the end of the text (a PEM
		// block without its END line would fire on any prefix).
		c := w.e.joiner.byID(f.Rule)
		for last-1 > first && c != nil && !strings.Contains(c.Pattern, `\z`) &&
			w.e.joiner.firesAcross(parts[first:last], f.Rule, key, ds) {
			last--
		}
		hit = append(hit, Finding{Rule: f.Rule, Detector: f.Detector, Path: path})
		for i := first; i <= last && i < len(parts); i++ {
			if _, ok := touched[i]; !ok {
				touched[i] = f.Rule
			}
		}
	}
	if len(hit) == 0 {
		return nothing
	}
	w.found = append(w.found, hit...)
	if w.fix == nil {
		return nothing
	}
	return func() {
		for i, rule := range touched {
			parts[i].set(Redacted(rule))
		}
	}
}

// firesAcross reports whether rule fires on the parts joined.
func (e *Engine) firesAcross(parts []part, rule, key string, ds []Detector) bool {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.s)
	}
	return slices.ContainsFunc(e.scan(b.String(), key, ds), func(f Finding) bool { return f.Rule == rule })
}

// inOnePart reports whether rule fires on one of the parts alone.
func (e *Engine) inOnePart(parts []part, rule, key string, ds []Detector) bool {
	for _, p := range parts {
		for _, f := range e.scan(p.s, key, ds) {
			if f.Rule == rule {
				return true
			}
		}
	}
	return false
}

// positional orders member names as a writer splitting a value would:
// first, start, head before the rest, last, end, tail after it, and
// numbered names by their number (part2 before part10).
func positional(keys []string) []string {
	rank := func(k string) int {
		l := strings.ToLower(k)
		for _, w := range []string{"first", "start", "begin", "head", "prefix", "initial"} {
			if strings.Contains(l, w) {
				return 0
			}
		}
		for _, w := range []string{"last", "end", "tail", "final", "suffix", "rest", "remainder"} {
			if strings.Contains(l, w) {
				return 2
			}
		}
		return 1
	}
	order := func(a, b string) int {
		if ra, rb := rank(a), rank(b); ra != rb {
			return cmp.Compare(ra, rb)
		}
		switch {
		case natural(a, b):
			return -1
		case natural(b, a):
			return 1
		}
		return 0
	}
	// Names already in that order (most objects' sorted names) are used
	// as they are, not copied.
	if slices.IsSortedFunc(keys, order) {
		return keys
	}
	out := slices.Clone(keys)
	slices.SortStableFunc(out, order)
	return out
}

// natural compares names with their digit runs read as numbers.
func natural(a, b string) bool {
	for a != "" && b != "" {
		da, db := digitPrefix(a), digitPrefix(b)
		if da != "" && db != "" {
			x, _ := strconv.Atoi(da)
			y, _ := strconv.Atoi(db)
			if x != y {
				return x < y
			}
			a, b = a[len(da):], b[len(db):]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func digitPrefix(s string) string {
	i := 0
	for i < len(s) && i < 9 && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
}

// byteArray reads an array of at least minByteArray integers from 0 to 255
// as the text it spells, if that is printable.
func byteArray(t []any) (string, bool) {
	if len(t) < minByteArray || len(t) > maxDecoded {
		return "", false
	}
	b := make([]byte, len(t))
	for i, x := range t {
		n, ok := x.(json.Number)
		if !ok {
			return "", false
		}
		v, err := strconv.Atoi(string(n))
		if err != nil || v < 0 || v > 255 {
			return "", false
		}
		b[i] = byte(v)
	}
	if !printable(b) {
		return "", false
	}
	return string(b), true
}

// scanValue scans one string of a document, found under the member name
// key, adding the finding its place implies.
func (e *Engine) scanValue(path, s string, named bool, key string, ds []Detector) []Finding {
	fs := e.scan(s, key, ds)
	if named && s != "" && (len(ds) == 0 || slices.Contains(ds, Secrets)) && !e.placeholder(s) {
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

// scanKey scans a member name: its text, and whether its place or shape
// makes it a credential.
func (e *Engine) scanKey(k string, collection bool, ds []Detector) []Finding {
	fs := e.scan(k, "", ds)
	if (len(ds) == 0 || slices.Contains(ds, Secrets)) && credentialKey(k, collection) {
		fs = append(fs, Finding{Rule: RuleNamedKey, Detector: Secrets, Offset: 0, Length: len(k)})
	}
	return fs
}

// safeKey is a member name as a finding's path may show it: with the
// secrets and personal data in it redacted, whatever is being scanned.
func (e *Engine) safeKey(k string, collection bool) string {
	if credentialKey(k, collection) {
		return Redacted(RuleNamedKey)
	}
	fs := e.scan(k, "", []Detector{Secrets, PII})
	if len(fs) == 0 {
		return k
	}
	return redact(k, fs)
}

// credentialKey reports whether a member name is a credential by itself:
// a random-looking name in a collection of credentials, or user:password.
func credentialKey(k string, collection bool) bool {
	if collection && randomLooking(k, 16) {
		return true
	}
	user, pass, ok := strings.Cut(k, ":")
	return ok && len(user) >= 2 && len(user) <= 64 && !strings.ContainsAny(user, " /") &&
		!strings.ContainsAny(pass, " /:") && randomLooking(pass, 10) && classes(pass) >= 3
}

// randomLooking reports whether s, at least n bytes long, mixes letters
// and digits the way generated tokens do and prose does not.
func randomLooking(s string, n int) bool {
	if len(s) < n || strings.ContainsAny(s, " \t\n") {
		return false
	}
	var letters, digits int
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			digits++
		case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			letters++
		}
	}
	return digits >= 2 && letters >= 2 && shannon(s) >= 3
}

// classes counts the kinds of characters in s: lower, upper, digit, other.
func classes(s string) int {
	var l, u, d, o int
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z':
			l = 1
		case c >= 'A' && c <= 'Z':
			u = 1
		case c >= '0' && c <= '9':
			d = 1
		default:
			o = 1
		}
	}
	return l + u + d + o
}

// authValue reports whether v, under the member name k, is a generated
// credential under a name too common to trust alone: a Docker config's
// "auth", where {"auth": "oauth2"} is a setting.
func authValue(k string, v any) bool {
	s, ok := v.(string)
	return ok && strings.EqualFold(k, "auth") && randomLooking(strings.TrimRight(s, "="), 12)
}
