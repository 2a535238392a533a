package httptool

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"slices"
	"strings"
)

// Redacted replaces a secret wherever it shows up in what a call returns.
const Redacted = "[REDACTED]"

// scrubber removes secret values, and their common encodings, from text.
// A nil scrubber changes nothing.
type scrubber struct {
	r *strings.Replacer
	// skeletons are the secrets' letters and digits, lower-cased, forwards
	// and reversed: a secret spaced out, grouped, cased otherwise, broken
	// across lines or split across JSON members still shows them in order.
	skeletons [][]byte
}

// Fuzzy matching is only for secrets long enough that their letters and
// digits cannot turn up in order by accident, and tolerates at most maxGap
// other bytes between two of them (a space, a dash, a line break and its
// indentation, a closing quote and an opening one).
const (
	minSkeleton = 8
	maxGap      = 16
)

// newScrubber covers each value as sent (raw, with its header prefix) and
// as a server may echo it: JSON-escaped, URL-escaped, upper- and
// lower-cased, reversed, base64 (standard and URL alphabets, padded or not,
// also inside a longer encoded text) and hex; and, through its skeleton,
// spaced, grouped, in any case and split across lines or JSON members.
func newScrubber(values ...string) *scrubber {
	var forms []string
	var skeletons [][]byte
	for _, v := range values {
		if v == "" {
			continue
		}
		rev := reverse(v)
		forms = append(forms, v, strings.ToUpper(v), strings.ToLower(v), rev, url.QueryEscape(v), url.PathEscape(v),
			base64.StdEncoding.EncodeToString([]byte(v)), base64.URLEncoding.EncodeToString([]byte(v)),
			base64.RawStdEncoding.EncodeToString([]byte(v)), base64.RawURLEncoding.EncodeToString([]byte(v)),
			hex.EncodeToString([]byte(v)), strings.ToUpper(hex.EncodeToString([]byte(v))))
		forms = append(forms, embeddedBase64(v)...)
		for _, html := range []bool{true, false} {
			var b bytes.Buffer
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(html)
			_ = enc.Encode(v)
			forms = append(forms, strings.TrimSuffix(strings.TrimSuffix(b.String(), "\n"), `"`)[1:])
		}
		if sk := skeleton(v); len(sk) >= minSkeleton {
			skeletons = append(skeletons, sk, []byte(reverse(string(sk))))
		}
	}
	if len(forms) == 0 {
		return nil
	}
	// Longest first, so a form containing another is replaced whole.
	slices.SortFunc(forms, func(a, b string) int { return cmp.Or(cmp.Compare(len(b), len(a)), strings.Compare(a, b)) })
	forms = slices.Compact(forms)
	args := make([]string, 0, 2*len(forms))
	for _, f := range forms {
		args = append(args, f, Redacted)
	}
	return &scrubber{r: strings.NewReplacer(args...), skeletons: skeletons}
}

// embeddedBase64 are the parts of the base64 of a text holding v that only
// v's bytes decide, at each of the three alignments v can start at: what
// shows of v when it is encoded inside something longer ("user:" + v in a
// Basic auth header, say). Parts shorter than minSkeleton are left out.
func embeddedBase64(v string) []string {
	var out []string
	for k := range 3 {
		padded := append(make([]byte, k), v...)
		first := (8*k + 5) / 6       // first character whose bits are all v's
		last := 8 * (k + len(v)) / 6 // one past the last such character
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			e := enc.EncodeToString(padded)
			if last-first >= minSkeleton && last <= len(e) {
				out = append(out, e[first:last])
			}
		}
	}
	return out
}

func reverse(s string) string {
	b := []byte(s)
	slices.Reverse(b)
	return string(b)
}

// alnum reports whether c is an ASCII letter or digit.
func alnum(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

func lower(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// skeleton is s's ASCII letters and digits, lower-cased.
func skeleton(s string) []byte {
	var out []byte
	for i := range len(s) {
		if alnum(s[i]) {
			out = append(out, lower(s[i]))
		}
	}
	return out
}

// spans are the byte ranges [start, end) of text (the concatenation of
// parts) where a skeleton shows with at most maxGap other bytes between its
// characters, merged and in order.
func (s *scrubber) spans(text func(i int) byte, n int) [][2]int {
	if len(s.skeletons) == 0 {
		return nil
	}
	var sk []byte
	var pos []int
	for i := range n {
		if c := text(i); alnum(c) {
			sk = append(sk, lower(c))
			pos = append(pos, i)
		}
	}
	var out [][2]int
	for _, p := range s.skeletons {
		for from := 0; from+len(p) <= len(sk); {
			k := bytes.Index(sk[from:], p)
			if k < 0 {
				break
			}
			k += from
			ok := true
			for j := k; j < k+len(p)-1; j++ {
				if pos[j+1]-pos[j]-1 > maxGap {
					ok = false
					break
				}
			}
			if ok {
				out = append(out, [2]int{pos[k], pos[k+len(p)-1] + 1})
			}
			from = k + 1
		}
	}
	if len(out) < 2 {
		return out
	}
	slices.SortFunc(out, func(a, b [2]int) int { return cmp.Compare(a[0], b[0]) })
	merged := out[:1]
	for _, sp := range out[1:] {
		if last := &merged[len(merged)-1]; sp[0] <= last[1] {
			last[1] = max(last[1], sp[1])
		} else {
			merged = append(merged, sp)
		}
	}
	return merged
}

// redactSpans replaces each span of v with Redacted.
func redactSpans(v string, spans [][2]int) string {
	if len(spans) == 0 {
		return v
	}
	var b strings.Builder
	at := 0
	for _, sp := range spans {
		b.WriteString(v[at:sp[0]])
		b.WriteString(Redacted)
		at = sp[1]
	}
	b.WriteString(v[at:])
	return b.String()
}

func (s *scrubber) String(v string) string {
	if s == nil {
		return v
	}
	v = s.r.Replace(v)
	return redactSpans(v, s.spans(func(i int) byte { return v[i] }, len(v)))
}

// JSON scrubs every string, key and number of a decoded JSON value; a
// number that held a secret becomes the string Redacted. A secret split
// across string values (members in key order, items in order) is found as
// a whole, and each part of it is redacted.
func (s *scrubber) JSON(v any) any {
	if s == nil {
		return v
	}
	v = s.json(v)
	var leaves []*string
	collect(&v, &leaves)
	if len(leaves) < 2 {
		return rebuild(v)
	}
	// The values as one text: where each starts in it.
	starts := make([]int, len(leaves)+1)
	for i, l := range leaves {
		starts[i+1] = starts[i] + len(*l)
	}
	leaf := 0
	at := func(i int) byte {
		for i >= starts[leaf+1] {
			leaf++
		}
		for i < starts[leaf] {
			leaf--
		}
		return (*leaves[leaf])[i-starts[leaf]]
	}
	spans := s.spans(at, starts[len(leaves)])
	if len(spans) == 0 {
		return rebuild(v)
	}
	for i, l := range leaves {
		var own [][2]int
		for _, sp := range spans {
			lo, hi := max(sp[0], starts[i]), min(sp[1], starts[i+1])
			if lo < hi {
				own = append(own, [2]int{lo - starts[i], hi - starts[i]})
			}
		}
		*l = redactSpans(*l, own)
	}
	// Write the changed strings back into their maps and slices.
	return rebuild(v)
}

// collect appends a pointer to every string value of *v, members in key
// order, replacing each string in place by its own pointed-to copy so
// rebuild can put changes back.
func collect(v *any, out *[]*string) {
	switch t := (*v).(type) {
	case string:
		p := new(string)
		*p = t
		*out = append(*out, p)
		*v = p
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			x := t[k]
			collect(&x, out)
			t[k] = x
		}
	case []any:
		for i := range t {
			collect(&t[i], out)
		}
	}
}

// rebuild turns the string pointers collect left back into strings.
func rebuild(v any) any {
	switch t := v.(type) {
	case *string:
		return *t
	case map[string]any:
		for k, x := range t {
			t[k] = rebuild(x)
		}
	case []any:
		for i, x := range t {
			t[i] = rebuild(x)
		}
	}
	return v
}

func (s *scrubber) json(v any) any {
	switch t := v.(type) {
	case string:
		return s.String(t)
	case json.Number:
		if c := s.String(string(t)); c != string(t) {
			return c
		}
		return t
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, x := range t {
			out[s.String(k)] = s.json(x)
		}
		return out
	case []any:
		for i, x := range t {
			t[i] = s.json(x)
		}
		return t
	}
	return v
}
