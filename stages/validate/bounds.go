package validate

import (
	"bytes"
	"encoding/json"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/detect"
	"github.com/toolgate/toolgate/internal/tools"
	"net/url"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Request bounds applied to every request's parameters.
const (
	DefaultMaxDepth       = 32
	DefaultMaxStringBytes = 64 << 10
)

// checkBounds refuses parameters nested deeper than maxDepth or holding a
// string (value or key) longer than maxString bytes.
func checkBounds(params []byte, maxDepth, maxString int) error {
	if withinBounds(params, maxDepth, maxString) {
		return nil
	}
	return tokenBounds(params, maxDepth, maxString)
}

// tokenBounds is checkBounds by the decoded tokens.
func tokenBounds(params []byte, maxDepth, maxString int) error {
	dec := json.NewDecoder(bytes.NewReader(params))
	dec.UseNumber()
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil // the schema check already accepted the document
		}
		switch t := tok.(type) {
		case json.Delim:
			if t == '{' || t == '[' {
				if depth++; depth > maxDepth {
					return api.NewError(api.InvalidParameters, api.EParameterBounds,
						"parameters nest deeper than %d levels", maxDepth)
				}
			} else {
				depth--
			}
		case string:
			if len(t) > maxString {
				return api.NewError(api.InvalidParameters, api.EParameterBounds,
					"a parameter string is %d bytes, the limit is %d", len(t), maxString)
			}
		}
	}
}

// withinBounds reports, from a pass over the bytes, parameters that
// checkBounds accepts: nested no deeper than maxDepth, and every string
// no longer than maxString as written, which in valid UTF-8 is never
// shorter than the string decoded (an escape decodes to fewer bytes).
// Parameters it does not vouch for are decoded token by token.
func withinBounds(params []byte, maxDepth, maxString int) bool {
	if !utf8.Valid(params) {
		return false // encoding/json decodes an invalid byte to three
	}
	depth, start, in, esc := 0, 0, false, false
	for i, c := range params {
		switch {
		case esc:
			esc = false
		case in && c == '\\':
			esc = true
		case c == '"':
			if in && i-start-1 > maxString {
				return false
			}
			in, start = !in, i
		case in:
		case c == '{' || c == '[':
			if depth++; depth > maxDepth {
				return false
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return !in
}

var checkDetectors = map[string]detect.Detector{
	tools.CheckSQL:    detect.SQLInjection,
	tools.CheckShell:  detect.CommandInjection,
	tools.CheckPrompt: detect.PromptInjection,
	tools.CheckPath:   detect.PathTraversal,
}

// checkInputs applies the manifest's per-parameter checks.
func checkInputs(m *tools.Manifest, params []byte, eng *detect.Engine) error {
	if len(m.InputChecks) == 0 {
		return nil
	}
	var doc any
	dec := json.NewDecoder(bytes.NewReader(params))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil
	}
	for ptr, checks := range m.InputChecks {
		v, ok := tools.Lookup(doc, ptr)
		if !ok {
			continue
		}
		for _, c := range checks {
			if c == tools.CheckPath {
				s, ok := v.(string)
				if !ok {
					return api.NewError(api.InvalidParameters, api.EParametersInvalid, "%s must be a path string", ptr)
				}
				if err := confine(s, m.Permissions.Filesystem); err != nil {
					return err.WithDetail("parameter", ptr)
				}
			}
			if str, ok := v.(string); ok && c == tools.CheckShell && detect.OptionInjection(str) {
				return api.NewError(api.InvalidParameters, api.EInputRuleFired,
					"parameter %s begins with a dash, so a program would read it as an option (rule %s)", ptr, detect.RuleOptionInjection).
					WithDetail("parameter", ptr).WithDetail("rule", detect.RuleOptionInjection).
					WithDetail("detector", detect.CommandInjection).WithDetail("rules_version", eng.Version())
			}
			raw, _ := json.Marshal(v)
			fs, err := eng.ScanJSON(raw, checkDetectors[c])
			if err != nil || len(fs) == 0 {
				continue
			}
			f := fs[0]
			return api.NewError(api.InvalidParameters, api.EInputRuleFired,
				"parameter %s looks like %s (rule %s)", ptr, strings.ReplaceAll(string(f.Detector), "_", " "), f.Rule).
				WithDetail("parameter", ptr).WithDetail("rule", f.Rule).WithDetail("detector", f.Detector).
				WithDetail("rules_version", eng.Version())
		}
	}
	return nil
}

// confine checks a path parameter against the granted roots: no NUL, no
// parent segments in any decoded form, and an absolute path must lie inside
// a granted root by whole path components, symlinks resolved where they exist.
func confine(p string, grants []tools.FilesystemPermission) *api.Error {
	deny := func(format string, args ...any) *api.Error {
		return api.NewError(api.PermissionDenied, api.EPathOutsideRoots, format, args...)
	}
	forms := []string{p}
	for d := p; len(forms) < 4; {
		next, err := url.PathUnescape(d)
		if err != nil || next == d {
			break
		}
		forms, d = append(forms, next), next
	}
	for _, f := range forms {
		if strings.ContainsRune(f, 0) {
			return deny("path contains a NUL byte")
		}
		for _, seg := range strings.FieldsFunc(f, func(r rune) bool { return r == '/' || r == '\\' }) {
			if seg == ".." {
				return deny("path %s climbs out of its directory", strconv.Quote(p))
			}
		}
	}
	// Paths relative to the file root (a leading slash means the same as
	// none, token.CleanPath) are confined by authorize and the executor. A
	// manifest naming only such roots makes every parameter one of them; an
	// absolute parameter is a host path only beside absolute roots.
	if !path.IsAbs(p) || (len(grants) > 0 && !slices.ContainsFunc(grants, func(g tools.FilesystemPermission) bool { return path.IsAbs(g.Path) })) {
		return nil
	}
	clean := resolve(path.Clean(p))
	for _, g := range grants {
		root := g.Path
		if !path.IsAbs(root) {
			continue
		}
		rel, err := filepath.Rel(resolve(path.Clean(root)), clean)
		if err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return nil
		}
	}
	return deny("path %s is outside the granted directories", strconv.Quote(p))
}

// resolve follows the symlinks of the longest part of p that exists on this
// host, so a link inside a root cannot lead a not-yet-existing file out of it.
func resolve(p string) string {
	rest := ""
	for dir := p; ; {
		if r, err := filepath.EvalSymlinks(dir); err == nil {
			return filepath.Join(r, rest)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return p
		}
		rest = filepath.Join(filepath.Base(dir), rest)
		dir = parent
	}
}
