package httptool

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/tools"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// DefaultMaxResponseBytes bounds a response body when the manifest sets no
// max_response_bytes; it matches the verify stage's default result bound.
const DefaultMaxResponseBytes = 1 << 20

// Spec is the http object of a manifest of kind http.
type Spec struct {
	// Method is GET (default), HEAD, POST, PUT, PATCH or DELETE.
	Method string `json:"method,omitempty"`
	// URL is an absolute http or https URL template. Placeholders {{name}}
	// take top-level parameters and may stand only after the host, where
	// they are escaped as one path segment or one query component; or the
	// whole template is one placeholder and the parameter is the URL.
	URL string `json:"url"`
	// Headers are sent with every request; values are templates.
	Headers map[string]string `json:"headers,omitempty"`
	// Body is a JSON template: a string that is exactly "{{name}}" becomes
	// the parameter's JSON value (an absent parameter drops the member),
	// other placeholders in strings are replaced by the parameter's text.
	Body json.RawMessage `json:"body,omitempty"`
	// BodyFromParameters sends the parameters object itself as the body.
	BodyFromParameters bool `json:"body_from_parameters,omitempty"`
	// Credentials are injected into request headers from the secret source.
	Credentials []Credential `json:"credentials,omitempty"`
	// MaxResponseBytes bounds the response body; a larger one is an error.
	MaxResponseBytes int64 `json:"max_response_bytes,omitempty"`
	// Response is how the body is returned: auto (JSON when the content type
	// says so and it parses, else text), json (must parse) or text.
	Response string `json:"response,omitempty"`
	// ResponseHeaders names the response headers returned besides
	// Content-Type.
	ResponseHeaders []string `json:"response_headers,omitempty"`
}

// Credential puts a secret into a request header: Prefix + value.
type Credential struct {
	Secret string `json:"secret"`
	Header string `json:"header"`
	Prefix string `json:"prefix,omitempty"`
}

// spec is a checked Spec with its templates parsed.
type spec struct {
	Spec
	url  *urlTemplate
	body any // decoded Body template; nil when there is none
}

var methods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"}

// misconfigured reports a manifest whose http object cannot be run.
func misconfigured(m *tools.Manifest, format string, args ...any) *api.Error {
	return api.NewError(api.ToolExecutionError, api.EExecutorUnavailable,
		"http configuration of %s: %s", m.Key(), fmt.Sprintf(format, args...)).WithDetail("not_started", true)
}

// decodeSpec reads and checks m's http object.
func decodeSpec(m *tools.Manifest) (*spec, error) {
	if len(bytes.TrimSpace(m.Spec())) == 0 {
		return nil, misconfigured(m, "missing")
	}
	var s spec
	dec := json.NewDecoder(bytes.NewReader(m.Spec()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s.Spec); err != nil {
		return nil, misconfigured(m, "%v", err)
	}
	s.Method = strings.ToUpper(s.Method)
	if s.Method == "" {
		s.Method = "GET"
	}
	if !slices.Contains(methods, s.Method) {
		return nil, misconfigured(m, "method %q is not one of %v", s.Method, methods)
	}
	var err error
	if s.url, err = parseURLTemplate(s.URL); err != nil {
		return nil, misconfigured(m, "url: %v", err)
	}
	for name := range s.Headers {
		if err := checkHeaderName(name); err != nil {
			return nil, misconfigured(m, "headers: %v", err)
		}
	}
	hasBody := len(s.Body) > 0 && string(bytes.TrimSpace(s.Body)) != "null"
	if hasBody && s.BodyFromParameters {
		return nil, misconfigured(m, "body and body_from_parameters exclude each other")
	}
	if (hasBody || s.BodyFromParameters) && (s.Method == "GET" || s.Method == "HEAD") {
		return nil, misconfigured(m, "a %s request has no body", s.Method)
	}
	if hasBody {
		d := json.NewDecoder(bytes.NewReader(s.Body))
		d.UseNumber()
		if err := d.Decode(&s.body); err != nil {
			return nil, misconfigured(m, "body: %v", err)
		}
	}
	for _, c := range s.Credentials {
		if !slices.Contains(m.Permissions.Credentials, c.Secret) {
			return nil, misconfigured(m, "credential %q is not declared in permissions.credentials", c.Secret)
		}
		if err := checkHeaderName(c.Header); err != nil {
			return nil, misconfigured(m, "credential %q: %v", c.Secret, err)
		}
		if strings.ContainsAny(c.Prefix, "\r\n\x00") {
			return nil, misconfigured(m, "credential %q: prefix holds a line break", c.Secret)
		}
	}
	switch s.Response {
	case "":
		s.Response = "auto"
	case "auto", "json", "text":
	default:
		return nil, misconfigured(m, "response %q is not auto, json or text", s.Response)
	}
	if s.MaxResponseBytes < 0 {
		return nil, misconfigured(m, "max_response_bytes is negative")
	}
	return &s, nil
}

// maxBytes is the response bound: the manifest's, else the default,
// narrowed by limits.output_bytes.
func (s *spec) maxBytes(m *tools.Manifest) int64 {
	n := s.MaxResponseBytes
	if n == 0 {
		n = DefaultMaxResponseBytes
	}
	if o := m.Limits.OutputBytes; o > 0 && o < n {
		n = o
	}
	return n
}

// checkHeaderName accepts RFC 9110 field names other than those net/http
// owns (Host, Content-Length, Transfer-Encoding, Connection).
func checkHeaderName(name string) error {
	if name == "" {
		return fmt.Errorf("empty header name")
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return fmt.Errorf("header name %q holds %q", name, c)
		}
	}
	switch strings.ToLower(name) {
	case "host", "content-length", "transfer-encoding", "connection":
		return fmt.Errorf("header %s is set by the client, not the manifest", name)
	}
	return nil
}

// placeholder matches {{name}}; names are top-level parameter names.
var placeholder = regexp.MustCompile(`\{\{\s*([^{}\s]+)\s*\}\}`)

// wholePlaceholder reports whether s is exactly one placeholder.
func wholePlaceholder(s string) (string, bool) {
	s = strings.TrimSpace(s)
	m := placeholder.FindStringSubmatchIndex(s)
	if m == nil || m[0] != 0 || m[1] != len(s) {
		return "", false
	}
	return s[m[2]:m[3]], true
}

// urlTemplate is a parsed URL template. Either whole names the parameter
// holding the entire URL, or origin is the literal scheme://host[:port] and
// parts the rest: placeholders cannot reach the scheme or the authority.
type urlTemplate struct {
	whole  string
	origin string
	parts  []urlPart
}

type urlPart struct {
	lit   string
	param string
	query bool // in the query: escaped as a query component, else as a path segment
}

func parseURLTemplate(tpl string) (*urlTemplate, error) {
	tpl = strings.TrimSpace(tpl)
	if tpl == "" {
		return nil, fmt.Errorf("missing")
	}
	if name, ok := wholePlaceholder(tpl); ok {
		return &urlTemplate{whole: name}, nil
	}
	scheme, after, ok := strings.Cut(tpl, "://")
	if !ok {
		return nil, fmt.Errorf("%q is not an absolute URL", tpl)
	}
	end := strings.IndexAny(after, "/?#")
	if end < 0 {
		end = len(after)
	}
	origin := scheme + "://" + after[:end]
	if strings.Contains(origin, "{{") {
		return nil, fmt.Errorf("placeholders may stand only after the host (or be the whole URL)")
	}
	u, err := url.Parse(origin)
	if err != nil {
		return nil, err
	}
	if err := checkAbsolute(u); err != nil {
		return nil, err
	}
	t := &urlTemplate{origin: origin}
	rest := after[end:]
	query, fragment := false, false
	for rest != "" {
		i := strings.Index(rest, "{{")
		lit := rest
		if i >= 0 {
			lit = rest[:i]
		}
		query = query || strings.Contains(lit, "?")
		fragment = fragment || strings.Contains(lit, "#")
		if lit != "" {
			t.parts = append(t.parts, urlPart{lit: lit})
		}
		if i < 0 {
			break
		}
		loc := placeholder.FindStringSubmatchIndex(rest[i:])
		if loc == nil || loc[0] != 0 {
			return nil, fmt.Errorf("unclosed placeholder in %q", tpl)
		}
		if fragment {
			return nil, fmt.Errorf("placeholders in the fragment are never sent")
		}
		t.parts = append(t.parts, urlPart{param: rest[i+loc[2] : i+loc[3]], query: query})
		rest = rest[i+loc[1]:]
	}
	return t, nil
}

// checkAbsolute accepts http and https URLs with a host and no user
// information: credentials come from the secret source, never from a URL.
func checkAbsolute(u *url.URL) error {
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("scheme %q is not http or https", u.Scheme)
	case u.Host == "" || u.Hostname() == "":
		return fmt.Errorf("no host")
	case u.User != nil:
		return fmt.Errorf("user information in URLs is refused; use credentials")
	}
	return nil
}

// expand builds the request URL from params.
func (t *urlTemplate) expand(params map[string]json.RawMessage) (*url.URL, error) {
	if t.whole != "" {
		raw, ok := params[t.whole]
		if !ok {
			return nil, badParams("parameter %s (the URL) is missing", t.whole)
		}
		s, err := text(t.whole, raw)
		if err != nil {
			return nil, err
		}
		u, err := url.Parse(s)
		if err != nil {
			return nil, badParams("parameter %s is not a URL", t.whole)
		}
		if err := checkAbsolute(u); err != nil {
			return nil, badParams("parameter %s: %v", t.whole, err)
		}
		u.Fragment, u.RawFragment = "", ""
		return u, nil
	}
	var b strings.Builder
	b.WriteString(t.origin)
	for _, p := range t.parts {
		if p.param == "" {
			b.WriteString(p.lit)
			continue
		}
		v, err := text(p.param, params[p.param])
		if err != nil {
			return nil, err
		}
		if p.query {
			b.WriteString(url.QueryEscape(v))
		} else {
			b.WriteString(url.PathEscape(v))
		}
	}
	u, err := url.Parse(b.String())
	if err != nil {
		return nil, badParams("the parameters make an invalid URL: %v", err)
	}
	// PathEscape keeps a value within its segment, but a value that is
	// "." or ".." would still be a segment servers resolve.
	for _, seg := range strings.Split(u.EscapedPath(), "/") {
		if d, err := url.PathUnescape(seg); err == nil && (d == "." || d == "..") {
			return nil, badParams("the parameters make a dot segment in the URL path")
		}
	}
	return u, nil
}

// text is a parameter as it appears in a URL or header: strings as they
// are, numbers and booleans as written, absent or null as "".
func text(name string, raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", badParams("parameter %s: %v", name, err)
		}
		return s, nil
	case '{', '[':
		return "", badParams("parameter %s is an object or array and cannot be placed in text", name)
	}
	return string(raw), nil
}

// expandText replaces the placeholders in s.
func expandText(s string, params map[string]json.RawMessage) (string, error) {
	var err error
	out := placeholder.ReplaceAllStringFunc(s, func(ph string) string {
		name := placeholder.FindStringSubmatch(ph)[1]
		v, e := text(name, params[name])
		if e != nil && err == nil {
			err = e
		}
		return v
	})
	return out, err
}

// expandBody fills a decoded body template. present is false for a
// placeholder naming an absent parameter: its object member is dropped.
func expandBody(tpl any, params map[string]json.RawMessage) (v any, present bool, err error) {
	switch t := tpl.(type) {
	case string:
		if name, ok := wholePlaceholder(t); ok {
			raw, ok := params[name]
			if !ok {
				return nil, false, nil
			}
			return raw, true, nil
		}
		s, err := expandText(t, params)
		return s, true, err
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, x := range t {
			y, ok, err := expandBody(x, params)
			if err != nil {
				return nil, false, err
			}
			if ok {
				out[k] = y
			}
		}
		return out, true, nil
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			y, _, err := expandBody(x, params)
			if err != nil {
				return nil, false, err
			}
			out[i] = y // an absent parameter is null here
		}
		return out, true, nil
	}
	return tpl, true, nil
}

// badParams reports parameters the request cannot be built from; nothing
// was sent.
func badParams(format string, args ...any) *api.Error {
	return api.NewError(api.InvalidParameters, api.EParametersInvalid, format, args...).WithDetail("not_started", true)
}
