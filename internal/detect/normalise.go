package detect

import (
	"encoding/base64"
	"encoding/hex"
	"html"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Bounds on decoding embedded base64 and hex, so that no input makes a scan
// decode more than a fixed amount.
const (
	// minEncodedRun is the shortest base64 or hex run that is decoded.
	minEncodedRun = 16
	// maxDecodes is how many runs one text has decoded at most.
	maxDecodes = 16
	// maxDecoded bounds the decoded bytes of one text.
	maxDecoded = 64 << 10
)

// normalise returns the forms of s the rules also run on, when they differ
// from s: the text with HTML entities and percent-encoding decoded, Unicode
// NFKC-normalised (full-width and compatibility forms), zero-width
// characters and soft hyphens removed and Cyrillic and Greek homoglyphs of
// Latin letters folded; and the text of base64 and hex runs that decode to
// mostly printable text. A finding in these forms is reported on the whole
// of s, since its offsets do not map back.
func normalise(s string) ([]string, bool) {
	var out []string
	if n := fold(s); n != s {
		out = append(out, n)
	}
	// A decoded run may hold another encoding (base64 of base64, hex of
	// base64): up to three rounds.
	for d, round := s, 0; round < 3; round++ {
		if d = decodeRuns(d); d == "" {
			break
		}
		out = append(out, d)
	}
	if d := decodeEscapes(s); d != "" {
		out = append(out, d)
		// The escapes decoded in place too: a secret half escaped, half
		// plain is read whole.
		if u := unescape(s); u != d {
			out = append(out, u)
		}
	}
	return out, len(out) > 0
}

// unescape returns s with its \xHH and \u00HH escapes decoded in place.
func unescape(s string) string {
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		switch {
		case i+3 < len(s) && s[i] == '\\' && (s[i+1] == 'x' || s[i+1] == 'X') && isHex(s[i+2]) && isHex(s[i+3]):
			b = append(b, unhex(s[i+2])<<4|unhex(s[i+3]))
			i += 4
		case i+5 < len(s) && s[i] == '\\' && s[i+1] == 'u' && s[i+2] == '0' && s[i+3] == '0' && isHex(s[i+4]) && isHex(s[i+5]):
			b = append(b, unhex(s[i+4])<<4|unhex(s[i+5]))
			i += 6
		default:
			b = append(b, s[i])
			i++
		}
	}
	return string(b)
}

// decodeEscapes returns the text spelled by the runs of \xHH escapes and
// by bracketed lists of byte values ([104, 105, ...]) in s, joined by
// newlines, or "" if s has none that decode to printable text.
func decodeEscapes(s string) string {
	var b strings.Builder
	if strings.Contains(s, `\x`) || strings.Contains(s, `\u00`) {
		var run []byte
		flush := func() {
			if len(run) >= minByteArray && printable(run) {
				b.Write(run)
				b.WriteByte('\n')
			}
			run = run[:0]
		}
		for i := 0; i < len(s); {
			if i+3 < len(s) && s[i] == '\\' && (s[i+1] == 'x' || s[i+1] == 'X') && isHex(s[i+2]) && isHex(s[i+3]) {
				run = append(run, unhex(s[i+2])<<4|unhex(s[i+3]))
				i += 4
				continue
			}
			// \u00HH: the ASCII range of \u escapes, the shape secrets have.
			if i+5 < len(s) && s[i] == '\\' && s[i+1] == 'u' && s[i+2] == '0' && s[i+3] == '0' && isHex(s[i+4]) && isHex(s[i+5]) {
				run = append(run, unhex(s[i+4])<<4|unhex(s[i+5]))
				i += 6
				continue
			}
			flush()
			i++
		}
		flush()
	}
	// Lists of byte values: [104, 105, …], bytes([…]), fromCharCode(…),
	// new byte[] {…}.
	for rest := s; b.Len() < maxDecoded; {
		i := strings.IndexAny(rest, "[({")
		if i < 0 {
			break
		}
		closer := map[byte]byte{'[': ']', '(': ')', '{': '}'}[rest[i]]
		rest = rest[i+1:]
		j := strings.IndexByte(rest, closer)
		if j < 0 || j > maxDecoded*4 {
			break
		}
		if d, ok := byteList(rest[:j]); ok {
			b.WriteString(d)
			b.WriteByte('\n')
			rest = rest[j+1:]
		}
	}
	return b.String()
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// byteList reads "104, 105, ..." (decimal or 0x-prefixed byte values,
// separated by commas and blanks) as the text it spells, if printable. It
// gives up at the first byte that cannot belong to such a list, before
// allocating: most brackets in a text hold something else.
func byteList(s string) (string, bool) {
	var out []byte
	for i := 0; i < len(s); {
		switch c := s[i]; {
		case c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r':
			i++
			continue
		case c < '0' || c > '9':
			return "", false
		}
		base, j := 10, i
		if j+1 < len(s) && s[j] == '0' && (s[j+1] == 'x' || s[j+1] == 'X') {
			base, j = 16, j+2
		}
		v, n := 0, 0
		for ; j < len(s) && n <= 3; j, n = j+1, n+1 {
			c := s[j]
			if c >= '0' && c <= '9' {
				v = v*base + int(c-'0')
			} else if base == 16 && isHex(c) {
				v = v*base + int(unhex(c))
			} else {
				break
			}
		}
		if n == 0 || n > 3 || v > 255 || j < len(s) && s[j] != ',' && s[j] != ' ' && s[j] != '\n' && s[j] != '\t' && s[j] != '\r' {
			return "", false
		}
		out = append(out, byte(v))
		i = j
	}
	if len(out) < minByteArray || !printable(out) {
		return "", false
	}
	return string(out), true
}

// form is a transformed text with the means to map a span of it back to
// the original.
type form struct {
	s string
	// at maps a byte of s to its byte in the original; nil when they
	// are the same; reversed says s is the original backwards.
	at       []int32
	reversed bool
	n        int // the original's length
}

// span maps [a, b) of the form to the original text.
func (f form) span(a, b int) (int, int) {
	switch {
	case f.reversed:
		return f.n - b, f.n - a
	case f.at != nil:
		return int(f.at[a]), int(f.at[b-1]) + 1
	}
	return a, b
}

// shapeForms are the forms of s a secret of a known shape may be hidden
// in, as far as the keyword pass's hints point to them: reversed; with
// line breaks (and backslash continuations) removed; with the blanks
// between runs of short groups removed ("A K I A …", "sk-p roj- …");
// ROT13-decoded. Only the Transformed rules run on them, and a match maps
// back to its place in s.
func shapeForms(s string, hints uint8) []form {
	if len(s) < 16 || len(s) > 1<<30 {
		return nil
	}
	var out []form
	if hints&hintReversed != 0 {
		b := []byte(s)
		slices.Reverse(b)
		out = append(out, form{s: string(b), reversed: true, n: len(s)})
	}
	if hints&hintPlain != 0 && strings.ContainsAny(s, "\n\r\"'") {
		out = append(out, removeBytes(s, func(i int) int {
			switch s[i] {
			case '"', '\'':
				return adjacentLiterals(s, i)
			case '\n', '\r':
				j := i + 1
				for j < len(s) && (s[j] == ' ' || s[j] == '\t') {
					j++
				}
				return j - i + sameLabel(s, i, j)
			case '\\':
				if i+1 < len(s) && (s[i+1] == '\n' || s[i+1] == '\r') {
					return 1
				}
			}
			return 0
		}))
	}
	if hints&hintPlain != 0 || spacedRun(s) {
		out = append(out, removeBytes(s, func(i int) int {
			if s[i] == ' ' && shortGroup(s, i, ' ') || s[i] == '-' && singles(s, i) {
				return 1
			}
			return 0
		}))
	}
	if hints&hintPlain != 0 && strings.Contains(s, "-") {
		// Groups joined by dashes ("ghp_-8rES-Qed…"), a form of its own:
		// removing them beside the blanks would also take the dashes of
		// "sk-proj-" spelled in groups.
		out = append(out, removeBytes(s, func(i int) int {
			if s[i] == '-' && shortGroup(s, i, '-') {
				return 1
			}
			return 0
		}))
	}
	if hints&hintROT13 != 0 {
		out = append(out, form{s: rot13(s), n: len(s)})
	}
	return out
}

func rot13(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z':
			b[i] = 'a' + (c-'a'+13)%26
		case c >= 'A' && c <= 'Z':
			b[i] = 'A' + (c-'A'+13)%26
		}
	}
	return string(b)
}

// singles reports whether the separator at i stands between two single
// characters ("g-h-p"), as in a secret spelled out; "sk-proj-" keeps its
// dashes.
func singles(s string, i int) bool {
	sep := s[i]
	alnum := func(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	return i >= 1 && i+1 < len(s) && s[i-1] != sep && s[i+1] != sep &&
		(i == 1 || !alnum(s[i-2])) && (i+2 == len(s) || !alnum(s[i+2]))
}

// spacedRun reports whether s holds eight or more single characters
// separated by single blanks or dashes ("A K I A 2 E 0 A", "g-h-p-_"), a
// secret spelled out.
func spacedRun(s string) bool {
	n := 0
	for i := 0; i+1 < len(s); i++ {
		if s[i] != ' ' && s[i] != '-' && (s[i+1] == ' ' || s[i+1] == '-') && (i == 0 || s[i-1] == ' ' || s[i-1] == '-') {
			if n++; n >= 8 {
				return true
			}
			i++
			continue
		}
		if s[i] != ' ' && s[i] != '-' {
			n = 0
		}
	}
	return false
}

// shortGroup reports whether the separator sep at i separates two groups
// of at most four other bytes, as a spaced or grouped secret is written
// ("ghp_ 8rES Qed…", "ghp_-8rES-Qed…").
func shortGroup(s string, i int, sep byte) bool {
	l := i
	for l > 0 && s[l-1] != sep && s[l-1] != ' ' && i-l <= 4 {
		l--
	}
	r := i + 1
	for r < len(s) && s[r] != sep && s[r] != ' ' && r-i-1 <= 4 {
		r++
	}
	return i-l >= 1 && i-l <= 4 && r-i-1 >= 1 && r-i-1 <= 4
}

// sameLabel returns the length of the label that begins the line at j
// ("token part 2/2: "), when the line ending at i began with the same one
// but for its digits: pieces of one value written a line each, each
// labelled, are read whole without their labels.
func sameLabel(s string, i, j int) int {
	label := func(from int) (string, int) {
		for k := from; k < len(s) && k-from <= 40 && s[k] != '\n'; k++ {
			if s[k] == ':' {
				n := k + 1
				for n < len(s) && s[n] == ' ' {
					n++
				}
				return strings.Map(func(r rune) rune {
					if r >= '0' && r <= '9' || r == '/' {
						return -1
					}
					return r
				}, s[from:k]), n - from
			}
		}
		return "", 0
	}
	next, n := label(j)
	if next == "" || strings.TrimSpace(next) == "" {
		return 0
	}
	prev := strings.LastIndexByte(s[:i], '\n') + 1
	for prev < i && (s[prev] == ' ' || s[prev] == '\t') {
		prev++
	}
	if p, _ := label(prev); p != next {
		return 0
	}
	return n
}

// adjacentLiterals returns how many bytes from the quote at i join two
// string literals written one after the other ("abc" "def", "abc" +
// "def", "abc" \ and a line break, then "def"): a value split across
// literals is read whole once they go. 0 if the quote does not close a
// literal continued so.
func adjacentLiterals(s string, i int) int {
	q := s[i]
	if i == 0 || s[i-1] == ' ' || s[i-1] == q {
		return 0
	}
	j := i + 1
	for j < len(s) && j-i < 16 {
		switch s[j] {
		case ' ', '\t', '\n', '\r', '\\', '+', '.', '&':
			j++
			continue
		case q:
			if j > i+1 {
				return j - i + 1
			}
		}
		break
	}
	return 0
}

// removeBytes returns s without the bytes drop says to skip at each place,
// with the map back to s.
func removeBytes(s string, drop func(i int) int) form {
	b := make([]byte, 0, len(s))
	at := make([]int32, 0, len(s))
	for i := 0; i < len(s); {
		if n := drop(i); n > 0 {
			i += n
			continue
		}
		b = append(b, s[i])
		at = append(at, int32(i))
		i++
	}
	return form{s: string(b), at: at, n: len(s)}
}

// fold applies the text normalisations, cheapest checks first.
func fold(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if strings.IndexByte(s, '&') >= 0 {
		s = html.UnescapeString(s)
	}
	if d, ok := percentDecoded(s); ok {
		s = d
	}
	if ascii && !hasNonASCII(s) {
		return s
	}
	s = norm.NFKC.String(s)
	return strings.Map(func(r rune) rune {
		switch r {
		case '\u00ad', '\u200b', '\u200c', '\u200d', '\u2060', '\ufeff', '\u180e':
			return -1
		}
		if l, ok := confusables[r]; ok {
			return l
		}
		return r
	}, s)
}

func hasNonASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return true
		}
	}
	return false
}

// confusables maps Cyrillic and Greek letters that look like Latin ones.
var confusables = map[rune]rune{
	'а': 'a', 'е': 'e', 'о': 'o', 'р': 'p', 'с': 'c', 'у': 'y', 'х': 'x', 'і': 'i', 'ј': 'j', 'ѕ': 's', 'ԁ': 'd', 'һ': 'h', 'ԛ': 'q', 'ԝ': 'w',
	'А': 'A', 'В': 'B', 'Е': 'E', 'К': 'K', 'М': 'M', 'Н': 'H', 'О': 'O', 'Р': 'P', 'С': 'C', 'Т': 'T', 'Х': 'X', 'У': 'Y', 'І': 'I', 'Ј': 'J', 'Ѕ': 'S',
	'α': 'a', 'ο': 'o', 'ρ': 'p', 'ι': 'i', 'κ': 'k', 'ν': 'v', 'υ': 'u', 'χ': 'x', 'ε': 'e', 'τ': 't',
	'Α': 'A', 'Β': 'B', 'Ε': 'E', 'Ζ': 'Z', 'Η': 'H', 'Ι': 'I', 'Κ': 'K', 'Μ': 'M', 'Ν': 'N', 'Ο': 'O', 'Ρ': 'P', 'Τ': 'T', 'Υ': 'Y', 'Χ': 'X',
}

func isB64(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '-' || c == '_'
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// decodeRuns decodes the base64 and hex runs of s that turn into mostly
// printable text and returns them joined by newlines, within the bounds.
func decodeRuns(s string) string {
	var b strings.Builder
	decodes := 0
	for i := 0; i < len(s) && decodes < maxDecodes && b.Len() < maxDecoded; {
		if !isB64(s[i]) {
			i++
			continue
		}
		j := i
		for j < len(s) && isB64(s[j]) {
			j++
		}
		run := s[i:j]
		for j < len(s) && s[j] == '=' {
			j++
		}
		i = j
		if len(run) < minEncodedRun {
			continue
		}
		run = run[:min(len(run), maxDecoded*4/3)]
		decodes++
		if d, ok := decodeRun(run); ok {
			b.WriteString(d[:min(len(d), maxDecoded-b.Len())])
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func decodeRun(run string) (string, bool) {
	allHex := true
	for i := 0; i < len(run); i++ {
		if !isHex(run[i]) {
			allHex = false
			break
		}
	}
	var d []byte
	var err error
	switch {
	case allHex && len(run)%2 == 0:
		d, err = hex.DecodeString(run)
	case strings.ContainsAny(run, "-_"):
		d, err = base64.RawURLEncoding.DecodeString(run[:len(run)/4*4+rawTail(len(run))])
	default:
		d, err = base64.RawStdEncoding.DecodeString(run[:len(run)/4*4+rawTail(len(run))])
	}
	if err != nil || !printable(d) {
		return "", false
	}
	return string(d), true
}

// rawTail is how many characters past the last whole quantum of n can be
// decoded without padding (a lone trailing character cannot).
func rawTail(n int) int {
	if n%4 == 1 {
		return 0
	}
	return n % 4
}

// printable reports whether at least 90% of d is printable UTF-8 text.
func printable(d []byte) bool {
	if len(d) == 0 || !utf8.Valid(d) {
		return false
	}
	bad, n := 0, 0
	for _, r := range string(d) {
		n++
		if !unicode.IsPrint(r) && r != '\n' && r != '\r' && r != '\t' {
			bad++
		}
	}
	return bad*10 <= n
}
