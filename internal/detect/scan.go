package detect

import (
	"net/url"
	"regexp"
	"regexp/syntax"
	"slices"
	"sort"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	ahocorasick "github.com/BobuSumisu/aho-corasick"
)

// Scanning cost. A rule with keywords runs only on windows of the text
// around its keywords' occurrences, all found in one Aho-Corasick pass over
// the ASCII-lower-cased text; windows that touch a match are widened until
// the match no longer touches their edge, so a window never cuts a match
// short. A rule without keywords runs on the whole text.
const (
	// reach is how far a window extends on either side of a keyword.
	reach = 256
	// MaxMatchesPerRule bounds the matches one rule reports in one text;
	// the last reported one then extends to the end of the text, so that
	// redaction stays complete while the cost stays bounded.
	MaxMatchesPerRule = 256
	// maxWindow bounds a window built from merged ones: small windows let
	// Go's regexp use its backtracking matcher, faster than its NFA; a
	// match across two windows touches their edge and widens the first.
	maxWindow = 2 << 10
)

// Hints of the keyword pass that a text may hide a Transformed rule's
// match in one of its shape forms (see shapeForms): one of those rules'
// keywords found reversed, ROT13-encoded, or as it is.
const (
	hintReversed uint8 = 1 << iota
	hintROT13
	hintPlain
)

func (e *Engine) buildTrie() {
	ids := map[string]int{}
	var words []string
	word := func(k string) int {
		k = asciiLower(k)
		i, ok := ids[k]
		if !ok {
			i = len(words)
			ids[k] = i
			words = append(words, k)
			e.byKeyword = append(e.byKeyword, nil)
			e.byAlso = append(e.byAlso, nil)
			e.hints = append(e.hints, 0)
		}
		return i
	}
	add := func(k string, c *compiled, to *[][]int) {
		i := word(k)
		if n := len((*to)[i]); n == 0 || (*to)[i][n-1] != c.idx {
			(*to)[i] = append((*to)[i], c.idx)
		}
	}
	if e.shapes != nil {
		// Shorter keywords would hint at most texts.
		for _, c := range e.shapes.all {
			for _, k := range c.Keywords {
				if len(k) < 3 {
					continue
				}
				b := []byte(asciiLower(k))
				e.hints[word(string(b))] |= hintPlain
				e.hints[word(rot13(string(b)))] |= hintROT13
				slices.Reverse(b)
				e.hints[word(string(b))] |= hintReversed
			}
		}
	}
	for _, c := range e.all {
		for _, k := range c.Keywords {
			add(k, c, &e.byKeyword)
		}
		for _, k := range c.Also {
			add(k, c, &e.byAlso)
		}
	}
	e.trie = ahocorasick.NewTrieBuilder().AddStrings(words).Build()
}

func asciiLower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			lowerBytes(b[i:])
			return string(b)
		}
	}
	return s
}

func lowerBytes(b []byte) {
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
}

var lowerPool = sync.Pool{New: func() any { return new([]byte) }}

type span struct{ start, end int }

// scratch is the per-rule state of one scan.
type scratch struct {
	want    []bool
	windows [][]span
	starts  [][]int
	also    [][]int
}

func (sc *scratch) reset(n int) {
	if len(sc.want) != n {
		*sc = scratch{want: make([]bool, n), windows: make([][]span, n), starts: make([][]int, n), also: make([][]int, n)}
		return
	}
	clear(sc.want)
	for i := range n {
		sc.windows[i], sc.starts[i], sc.also[i] = sc.windows[i][:0], sc.starts[i][:0], sc.also[i][:0]
	}
}

// scanRaw runs the rules of ds over s as it is.
func (e *Engine) scanRaw(s string, ds []Detector) []Finding {
	out, _ := e.scanHints(s, ds)
	return out
}

// scanHints is scanRaw, also returning the hints of the keyword pass.
func (e *Engine) scanHints(s string, ds []Detector) (out []Finding, hints uint8) {
	if s == "" {
		return nil, 0
	}
	// Per-rule state comes from a pool: in a JSON document most strings
	// are short, and allocating it for each would cost more than the scan.
	sc := e.scratch.Get().(*scratch)
	defer e.scratch.Put(sc)
	sc.reset(len(e.all))
	want, windows, starts, also := sc.want, sc.windows, sc.starts, sc.also
	if len(ds) == 0 {
		ds = All
	}
	for _, d := range ds {
		for _, r := range e.rules[d] {
			want[r.idx] = true
		}
	}
	bp := lowerPool.Get().(*[]byte)
	lower := append((*bp)[:0], s...)
	lowerBytes(lower)
	// The start of the line of the last keyword of a rule of lines, found
	// by reading each byte once: such keywords hold no line break, so
	// their starts only move forward across lines.
	lineAt, lineFrom := 0, 0
	lineOf := func(p int) int {
		if p > lineFrom {
			if i := strings.LastIndexByte(s[lineFrom:p], '\n'); i >= 0 {
				lineAt = lineFrom + i + 1
			}
			lineFrom = p
		}
		return lineAt
	}
	e.trie.Walk(lower, func(end, n, pattern int64) bool {
		start := int(end) + 1 - int(n)
		hints |= e.hints[pattern]
		w := span{max(0, start-reach), min(len(s), int(end)+1+reach)}
		for _, ri := range e.byAlso[pattern] {
			if want[ri] {
				also[ri] = append(also[ri], start)
			}
		}
		for _, ri := range e.byKeyword[pattern] {
			if !want[ri] {
				continue
			}
			if c := e.all[ri]; c.Lines {
				if l, k := lineOf(start), len(starts[ri]); k == 0 || starts[ri][k-1] != l {
					starts[ri] = append(starts[ri], l)
				}
				continue
			} else if c.at != nil {
				if c.midWord(s, start) {
					continue // cannot begin a match
				}
				if c.first != nil && !c.first[s[start]] {
					continue // found case-blind where the rule is not
				}
				if k := len(starts[ri]); k == 0 || starts[ri][k-1] != start {
					starts[ri] = append(starts[ri], start)
				}
				continue
			}
			ws := windows[ri]
			if k := len(ws) - 1; k >= 0 && w.start <= ws[k].end && ws[k].end-ws[k].start < maxWindow {
				ws[k].start = min(ws[k].start, w.start)
				ws[k].end = max(ws[k].end, w.end)
				continue
			}
			windows[ri] = append(ws, w)
		}
		return true
	})
	*bp = lower
	lowerPool.Put(bp)
	for i, c := range e.all {
		if !want[i] {
			continue
		}
		if len(c.Also) > 0 {
			if len(also[i]) == 0 {
				continue
			}
			sort.Ints(also[i])
		}
		if c.at != nil {
			out = c.findAt(s, starts[i], also[i], out)
			continue
		}
		ws := windows[i]
		if len(c.Also) > 0 {
			kept := ws[:0]
			for _, w := range ws {
				if near(also[i], w.start, w.end) {
					kept = append(kept, w)
				}
			}
			ws = kept
		}
		if len(c.Keywords) == 0 {
			ws = ws[:0]
			for a := 0; a < len(s); a += maxWindow {
				ws = append(ws, span{a, min(len(s), a+maxWindow)})
			}
		}
		out = c.findWindows(s, ws, out)
	}
	return out, hints
}

// findWindows appends the matches of c in the windows ws of s. Where a
// window starts at a place scanning has already reached (a merged window
// split at maxWindow, or a scan resumed after MaxMatchesPerRule raw
// matches), it starts overlap bytes earlier so that a match cut by the
// split is still found whole; matches ending before that place are not
// reported again.
func (c *compiled) findWindows(s string, ws []span, out []Finding) []Finding {
	const overlap = 64
	n := 0
	scanned := 0 // matches ending at or before this have been reported
	for _, w := range ws {
		if w.end <= scanned {
			continue
		}
		if w.start < scanned {
			w.start = max(0, scanned-overlap)
		}
		floor, from, leftFloor := scanned, 0, scanned
		for {
			locs := widen(c.re, s, &w, MaxMatchesPerRule, leftFloor)
			for _, loc := range locs {
				a, b := w.start+loc[0], w.start+loc[1]
				if b <= floor || a < from || c.valid != nil && !c.valid(s[a:b]) {
					continue
				}
				if n++; n == MaxMatchesPerRule {
					return append(out, Finding{Rule: c.ID, Detector: c.Detector, Offset: a, Length: len(s) - a})
				}
				out = append(out, Finding{Rule: c.ID, Detector: c.Detector, Offset: a, Length: b - a})
				scanned = max(scanned, b)
			}
			if len(locs) < MaxMatchesPerRule {
				scanned = max(scanned, w.end)
				break
			}
			// The limit stopped the matcher: go on where it stopped, as
			// it would have (the next match starts there or later). The
			// overlap holds fewer matches than the limit, so this
			// progresses; no widening to the left, which could undo it.
			from = w.start + max(locs[len(locs)-1][1], locs[len(locs)-1][0]+1)
			scanned = max(scanned, from)
			if from >= w.end {
				break
			}
			w.start, leftFloor = max(0, from-overlap), len(s)
		}
	}
	return out
}

// findAt appends the matches of an anchored rule starting at ps.
func (c *compiled) findAt(s string, ps, also []int, out []Finding) []Finding {
	sort.Ints(ps)
	n, last := 0, -1
	for i, p := range ps {
		if p < last || i > 0 && p == ps[i-1] {
			continue
		}
		if c.midWord(s, p) {
			continue
		}
		if len(c.Also) > 0 && !near(also, p, p+reach) {
			continue
		}
		// Only as much text as a match can span: the matcher's setup cost
		// grows with its input. An unbounded match is looked for first in
		// as much text as shows one, then in more while it runs to the end.
		limit := len(s)
		if c.Lines {
			if i := strings.IndexByte(s[p:], '\n'); i >= 0 {
				limit = p + i
			}
		}
		var loc []int
		if c.tail != nil {
			// Most matches end in the first run of the tail: the text up
			// to its end first, the rest only if that holds none.
			e := c.tail.first(s[p:limit])
			if e < 0 {
				continue
			}
			// A run that ended holds the whole of a match ending in it.
			if e += p; e == limit || !c.tail.set[s[e]] {
				loc = c.findFrom(s, p, e, e)
			} else {
				loc = c.findFrom(s, p, e, limit)
			}
		}
		if loc == nil {
			end := limit
			if c.span > 0 {
				end = min(limit, p+c.span)
			} else if c.witness > 0 {
				end = min(limit, p+c.witness)
			}
			loc = c.findFrom(s, p, end, limit)
		}
		if loc == nil {
			continue
		}
		a, b := p+loc[0], p+loc[1]
		// As a scan of the whole text would, go on after a match even
		// when its validator refuses it.
		last = max(b, a+1)
		if c.valid != nil && !c.valid(s[a:b]) {
			continue
		}
		if n++; n == MaxMatchesPerRule {
			b = len(s)
		}
		out = append(out, Finding{Rule: c.ID, Detector: c.Detector, Offset: a, Length: b - a})
		last = max(b, a+1)
		if n == MaxMatchesPerRule {
			break
		}
	}
	return out
}

// midWord reports whether an anchored rule that begins at a word boundary
// cannot begin at p, inside a word.
func (c *compiled) midWord(s string, p int) bool {
	return c.wordStart && p > 0 && isWord(s[p-1]) && isWord(s[p]) && !(c.underscore && s[p] == '_')
}

// findFrom matches the anchored rule at p in s[p:end], widening end up to
// limit while the match runs to it (an unbounded match may go on).
func (c *compiled) findFrom(s string, p, end, limit int) []int {
	loc := c.at.FindStringIndex(s[p:end])
	for c.span == 0 && loc != nil && p+loc[1] == end && end < limit {
		end = min(limit, p+4*(end-p))
		loc = c.at.FindStringIndex(s[p:end])
	}
	return loc
}

// near reports whether a sorted position of ps lies in [from, to).
func near(ps []int, from, to int) bool {
	i := sort.SearchInts(ps, from)
	return i < len(ps) && ps[i] < to
}

func isWord(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// widen matches re in s[w.start:w.end], widening w while a match touches an
// edge that is not the text's (an anchor or \b may have fired there, or the
// match may go on), and returns the matches relative to w.start. A match
// ending at or before floor is already known and widens nothing.
func widen(re *regexp.Regexp, s string, w *span, limit, floor int) [][]int {
	grow := 4 * reach
	for {
		locs := re.FindAllStringIndex(s[w.start:w.end], limit)
		left := len(locs) > 0 && w.start > 0 && locs[0][0] == 0 && w.start+locs[0][1] > floor
		right := len(locs) > 0 && len(locs) < limit && w.end < len(s) && locs[len(locs)-1][1] == w.end-w.start
		if !left && !right {
			return locs
		}
		if left {
			w.start = max(0, w.start-grow)
		}
		if right {
			w.end = min(len(s), w.end+grow)
		}
		grow *= 4
	}
}

// percentDecoded returns s percent-decoded up to three rounds, or false if
// it holds no escapes.
func percentDecoded(s string) (string, bool) {
	if !strings.Contains(s, "%") {
		return "", false
	}
	d := s
	for range 3 {
		next, err := url.PathUnescape(d)
		if err != nil || next == d {
			break
		}
		d = next
	}
	return d, d != s
}

// Detected reports whether any detector of ds fires on s.
func (e *Engine) Detected(s string, ds ...Detector) bool { return len(e.Scan(s, ds...)) > 0 }

// maxSpan is the most bytes a match of re can span (plus one, for a \b
// looking at the next byte), or 0 when unbounded.
func maxSpan(pattern string) int {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return 0
	}
	n := maxLen(re.Simplify())
	if n < 0 {
		return 0
	}
	return n + 1
}

// tailRun is what a pattern's matches end in: at least min bytes of set,
// beginning at most head bytes after the match begins (x{8,} after a
// bounded name and operator). An anchored rule is tried only where such a
// run follows: a byte loop is cheaper than a matcher.
type tailRun struct {
	set       [256]bool
	min, head int
}

// tailOf returns the tail run of pattern, or nil when its matches do not
// all end in a run of 4 or more bytes of one class after a bounded head.
func tailOf(pattern string) *tailRun {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return nil
	}
	t := new(tailRun)
	if !t.add(re, 0) || t.min < 4 {
		return nil
	}
	return t
}

// add adds the tails of re, which begins head bytes into a match at most,
// and reports whether re ends in one wherever it ends.
func (t *tailRun) add(re *syntax.Regexp, head int) bool {
	switch re.Op {
	case syntax.OpCapture:
		return t.add(re.Sub[0], head)
	case syntax.OpConcat:
		if len(re.Sub) == 0 {
			return false
		}
		h := maxLen(&syntax.Regexp{Op: syntax.OpConcat, Sub: re.Sub[:len(re.Sub)-1], Flags: re.Flags})
		return h >= 0 && t.add(re.Sub[len(re.Sub)-1], head+h)
	case syntax.OpAlternate:
		for _, sub := range re.Sub {
			if !t.add(sub, head) {
				return false
			}
		}
		return true
	case syntax.OpRepeat, syntax.OpPlus:
		n := 1
		if re.Op == syntax.OpRepeat {
			n = re.Min
		}
		cc := re.Sub[0]
		if cc.Op != syntax.OpCharClass || n < 1 {
			return false
		}
		for i := 0; i+1 < len(cc.Rune); i += 2 {
			for r := cc.Rune[i]; r <= cc.Rune[i+1] && r < utf8.RuneSelf; r++ {
				t.set[r] = true
			}
			if cc.Rune[i+1] >= utf8.RuneSelf {
				for b := 0x80; b < 256; b++ {
					t.set[b] = true
				}
			}
		}
		if t.min == 0 || n < t.min {
			t.min = n
		}
		t.head = max(t.head, head)
		return true
	}
	return false
}

// first returns where the first run of the tail in s (from a match's
// start) that begins within the head ends, or reach bytes past its least
// length if it goes on; -1 if there is none.
func (t *tailRun) first(s string) int {
	run := 0
	for i := 0; i < len(s); i++ {
		if t.set[s[i]] {
			if run++; run >= t.min {
				for stop := min(len(s), i+reach); i < stop && t.set[s[i]]; {
					i++
				}
				return i
			}
		} else if run = 0; i >= t.head {
			return -1
		}
	}
	return -1
}

// witnessSpan is, for a pattern whose only unbounded parts end its
// matches (a prefix, then x{8,}), the most bytes the shortest form of a
// match spans: every match begins with such a form, so text of that length
// from a place shows whether a match starts there. 0 when the pattern has
// unbounded parts elsewhere.
func witnessSpan(pattern string) int {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return 0
	}
	n := maxLen(shortTail(re.Simplify()))
	if n < 0 {
		return 0
	}
	return n + 1
}

// shortTail returns re with its trailing unbounded repetitions cut to their
// least count.
func shortTail(re *syntax.Regexp) *syntax.Regexp {
	c := *re
	switch re.Op {
	case syntax.OpConcat:
		if len(re.Sub) > 0 {
			c.Sub = append(append([]*syntax.Regexp(nil), re.Sub[:len(re.Sub)-1]...), shortTail(re.Sub[len(re.Sub)-1]))
		}
	case syntax.OpAlternate, syntax.OpCapture:
		c.Sub = make([]*syntax.Regexp, len(re.Sub))
		for i, sub := range re.Sub {
			c.Sub[i] = shortTail(sub)
		}
	case syntax.OpStar:
		return &syntax.Regexp{Op: syntax.OpEmptyMatch}
	case syntax.OpPlus:
		return re.Sub[0]
	case syntax.OpRepeat:
		if re.Max < 0 {
			c.Max = re.Min
		}
	}
	return &c
}

func maxLen(re *syntax.Regexp) int {
	switch re.Op {
	case syntax.OpLiteral:
		n := 0
		for _, r := range re.Rune {
			n += utf8.RuneLen(r)
			if re.Flags&syntax.FoldCase != 0 {
				n += 2 // a folded rune may be longer (K, the Kelvin sign)
			}
		}
		return n
	case syntax.OpCharClass, syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		return utf8.UTFMax
	case syntax.OpEmptyMatch, syntax.OpBeginLine, syntax.OpEndLine, syntax.OpBeginText, syntax.OpEndText,
		syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return 0
	case syntax.OpCapture:
		return maxLen(re.Sub[0])
	case syntax.OpQuest:
		return maxLen(re.Sub[0])
	case syntax.OpRepeat:
		if re.Max < 0 {
			return -1
		}
		n := maxLen(re.Sub[0])
		if n < 0 {
			return -1
		}
		return n * re.Max
	case syntax.OpConcat:
		t := 0
		for _, sub := range re.Sub {
			n := maxLen(sub)
			if n < 0 {
				return -1
			}
			t += n
		}
		return t
	case syntax.OpAlternate:
		m := 0
		for _, sub := range re.Sub {
			n := maxLen(sub)
			if n < 0 {
				return -1
			}
			m = max(m, n)
		}
		return m
	}
	return -1 // star, plus, anything else
}

// firstBytes is the set of bytes a non-empty match of pattern can begin
// with, or nil when a match may be empty or the set is not worth knowing.
// Keywords are found case-blind, so a case-sensitive rule's keyword hit is
// often a place no match can start; the set rules those out in one lookup.
func firstBytes(pattern string) *[256]bool {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return nil
	}
	var set [256]bool
	if nullable := addFirst(re.Simplify(), &set); nullable {
		return nil
	}
	return &set
}

// addFirst adds to set the bytes a match of re can begin with and reports
// whether re matches the empty string. Any rune outside ASCII adds every
// byte from 0x80, which covers its encodings and invalid UTF-8 (read as
// U+FFFD).
func addFirst(re *syntax.Regexp, set *[256]bool) (nullable bool) {
	addRune := func(r rune) {
		if r >= utf8.RuneSelf {
			for b := 0x80; b < 256; b++ {
				set[b] = true
			}
			return
		}
		set[r] = true
	}
	switch re.Op {
	case syntax.OpLiteral:
		if len(re.Rune) == 0 {
			return true
		}
		r := re.Rune[0]
		addRune(r)
		if re.Flags&syntax.FoldCase != 0 {
			for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
				addRune(f)
			}
		}
		return false
	case syntax.OpCharClass:
		for i := 0; i+1 < len(re.Rune); i += 2 {
			lo, hi := re.Rune[i], re.Rune[i+1]
			for r := lo; r <= hi && r < utf8.RuneSelf; r++ {
				set[r] = true
			}
			if hi >= utf8.RuneSelf {
				addRune(hi)
			}
		}
		return false
	case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		for b := range set {
			set[b] = true
		}
		return false
	case syntax.OpCapture, syntax.OpPlus:
		return addFirst(re.Sub[0], set)
	case syntax.OpStar, syntax.OpQuest:
		addFirst(re.Sub[0], set)
		return true
	case syntax.OpRepeat:
		return addFirst(re.Sub[0], set) || re.Min == 0
	case syntax.OpConcat:
		for _, sub := range re.Sub {
			if !addFirst(sub, set) {
				return false
			}
		}
		return true
	case syntax.OpAlternate:
		for _, sub := range re.Sub {
			if addFirst(sub, set) {
				nullable = true
			}
		}
		return nullable
	case syntax.OpNoMatch:
		return false
	}
	return true // empty-width: assertions, ^, $, the empty match
}
