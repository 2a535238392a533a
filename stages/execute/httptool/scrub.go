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
}

// newScrubber covers each value as sent (raw, with its header prefix) and
// as a server may echo it: JSON-escaped, URL-escaped, base64 (standard and
// URL alphabets, padded or not) and hex.
func newScrubber(values ...string) *scrubber {
	var forms []string
	for _, v := range values {
		if v == "" {
			continue
		}
		forms = append(forms, v, url.QueryEscape(v), url.PathEscape(v),
			base64.StdEncoding.EncodeToString([]byte(v)), base64.URLEncoding.EncodeToString([]byte(v)),
			base64.RawStdEncoding.EncodeToString([]byte(v)), base64.RawURLEncoding.EncodeToString([]byte(v)),
			hex.EncodeToString([]byte(v)), strings.ToUpper(hex.EncodeToString([]byte(v))))
		for _, html := range []bool{true, false} {
			var b bytes.Buffer
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(html)
			_ = enc.Encode(v)
			forms = append(forms, strings.TrimSuffix(strings.TrimSuffix(b.String(), "\n"), `"`)[1:])
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
	return &scrubber{r: strings.NewReplacer(args...)}
}

func (s *scrubber) String(v string) string {
	if s == nil {
		return v
	}
	return s.r.Replace(v)
}

// JSON scrubs every string, key and number of a decoded JSON value; a
// number that held a secret becomes the string Redacted.
func (s *scrubber) JSON(v any) any {
	if s == nil {
		return v
	}
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
			out[s.String(k)] = s.JSON(x)
		}
		return out
	case []any:
		for i, x := range t {
			t[i] = s.JSON(x)
		}
		return t
	}
	return v
}
