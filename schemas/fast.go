package schemas

import (
	"bytes"
	"math/big"
	"strconv"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// maxMembers bounds the members of an object whose names vouchJSON checks
// (for duplicates, which decode resolves to the last); a larger object is
// left to the library.
const maxMembers = 32

// vouchJSON reports, from one pass over doc (valid JSON and valid UTF-8),
// that the library would find what decode makes of doc valid against s,
// so that a valid document is neither decoded nor given to the library,
// whose bookkeeping (instance locations, evaluated-property sets) costs
// several times the pass. It knows the keywords toolgate's own schemas and
// most tools' input schemas use (type, enum, const, properties, required,
// additionalProperties, items, string lengths and pattern, integer bounds,
// $ref, allOf) and checks each exactly as the library does, or more
// strictly. Anything else, anything that fails, and bytes that are not
// plainly the decoded value (a name, or a checked string, holding an
// escape; a name given twice) it leaves to the library, whose verdict and
// field errors stand.
func vouchJSON(s *jsonschema.Schema, doc []byte) bool {
	w := walker{b: doc}
	w.space()
	if !w.value(s, 0) {
		return false
	}
	w.space()
	return w.i == len(w.b)
}

type walker struct {
	b []byte
	i int
}

func (w *walker) space() {
	for w.i < len(w.b) {
		switch w.b[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return
		}
	}
}

// value checks the value at w.i against s and moves past it.
func (w *walker) value(s *jsonschema.Schema, inPlace int) bool {
	if inPlace > maxInPlace || !plain(s) || w.i >= len(w.b) {
		return false
	}
	start := w.i
	if s.Always != nil {
		w.skip()
		return *s.Always
	}
	var ok bool
	switch c := w.b[w.i]; {
	case c == '{':
		ok = hasKind(s.Types, "object", false) && w.object(s)
	case c == '[':
		ok = hasKind(s.Types, "array", false) && w.array(s)
	case c == '"':
		ok = w.str(s)
	case c == 't' || c == 'f':
		w.i += 4
		if c == 'f' {
			w.i++
		}
		ok = hasKind(s.Types, "boolean", false) && len(s.Constant) == 0 && len(s.Enum) == 0
	case c == 'n':
		w.i += 4
		ok = hasKind(s.Types, "null", false) && len(s.Constant) == 0 && len(s.Enum) == 0
	default:
		ok = w.number(s)
	}
	if !ok {
		return false
	}
	end := w.i
	// $ref and allOf apply to the same value: read it again by each.
	if s.Ref != nil {
		if w.i = start; !w.value(s.Ref, inPlace+1) || w.i != end {
			return false
		}
	}
	for _, sch := range s.AllOf {
		if w.i = start; !w.value(sch, inPlace+1) || w.i != end {
			return false
		}
	}
	return true
}

// hasKind is hasType for a value of kind t (integer: written as one).
func hasKind(types []string, t string, integer bool) bool {
	if len(types) == 0 {
		return true
	}
	for _, want := range types {
		if want == t || integer && want == "integer" {
			return true
		}
	}
	return false
}

func (w *walker) object(s *jsonschema.Schema) bool {
	if len(s.Constant) > 0 || len(s.Enum) > 0 {
		return false
	}
	closed := false
	var extra *jsonschema.Schema
	switch a := s.AdditionalProperties.(type) {
	case nil:
	case bool:
		closed = !a
	case *jsonschema.Schema:
		extra = a
	default:
		return false
	}
	if len(s.Properties) == 0 && len(s.Required) == 0 && !closed && extra == nil && s.MinProperties == -1 && s.MaxProperties == -1 {
		w.skip()
		return true
	}
	var names [maxMembers][]byte
	n := 0
	w.i++ // {
	for {
		w.space()
		if w.b[w.i] == '}' {
			w.i++
			break
		}
		name, plainName := w.raw()
		if !plainName || n == maxMembers {
			return false
		}
		for _, seen := range names[:n] {
			if bytes.Equal(seen, name) {
				return false
			}
		}
		names[n], n = name, n+1
		w.space()
		w.i++ // :
		w.space()
		sch, ok := s.Properties[string(name)]
		switch {
		case ok:
		case closed:
			return false
		case extra != nil:
			sch = extra
		}
		if sch == nil {
			w.skip()
		} else if !w.value(sch, 0) {
			return false
		}
		w.space()
		if w.b[w.i] == ',' {
			w.i++
		}
	}
	if s.MinProperties != -1 && n < s.MinProperties || s.MaxProperties != -1 && n > s.MaxProperties {
		return false
	}
required:
	for _, want := range s.Required {
		for _, name := range names[:n] {
			if string(name) == want {
				continue required
			}
		}
		return false
	}
	return true
}

func (w *walker) array(s *jsonschema.Schema) bool {
	if len(s.Constant) > 0 || len(s.Enum) > 0 {
		return false
	}
	items := s.Items2020
	if s.Items != nil {
		sch, ok := s.Items.(*jsonschema.Schema)
		if !ok || items != nil {
			return false
		}
		items = sch
	}
	n := 0
	w.i++ // [
	for {
		w.space()
		if w.b[w.i] == ']' {
			w.i++
			break
		}
		if items == nil {
			w.skip()
		} else if !w.value(items, 0) {
			return false
		}
		n++
		w.space()
		if w.b[w.i] == ',' {
			w.i++
		}
	}
	return (s.MinItems == -1 || n >= s.MinItems) && (s.MaxItems == -1 || n <= s.MaxItems)
}

func (w *walker) str(s *jsonschema.Schema) bool {
	v, plainStr := w.raw()
	if !hasKind(s.Types, "string", false) {
		return false
	}
	checked := s.MinLength != -1 || s.MaxLength != -1 || s.Pattern != nil || len(s.Constant) > 0 || len(s.Enum) > 0
	if !checked {
		return true
	}
	if !plainStr {
		return false
	}
	if s.MinLength != -1 || s.MaxLength != -1 {
		n := utf8.RuneCount(v)
		if s.MinLength != -1 && n < s.MinLength || s.MaxLength != -1 && n > s.MaxLength {
			return false
		}
	}
	if s.Pattern != nil && !s.Pattern.Match(v) {
		return false
	}
	if len(s.Constant) > 0 && !sameString(string(v), s.Constant[0]) {
		return false
	}
	return len(s.Enum) == 0 || inEnum(string(v), s.Enum)
}

func (w *walker) number(s *jsonschema.Schema) bool {
	start := w.i
	for w.i < len(w.b) && !delimiter(w.b[w.i]) {
		w.i++
	}
	n := string(w.b[start:w.i])
	integer := integral(n)
	if !hasKind(s.Types, "number", integer) || len(s.Constant) > 0 || len(s.Enum) > 0 {
		return false
	}
	if s.Minimum == nil && s.Maximum == nil && s.ExclusiveMinimum == nil && s.ExclusiveMaximum == nil {
		return true
	}
	if !integer {
		return false
	}
	x, err := strconv.ParseInt(n, 10, 64)
	return err == nil && withinBounds(s, x)
}

// raw reads the string at w.i and returns its bytes between the quotes,
// and whether they are its value (no escape).
func (w *walker) raw() ([]byte, bool) {
	w.i++ // "
	start, plainStr := w.i, true
	for {
		switch w.b[w.i] {
		case '\\':
			plainStr = false
			w.i += 2
			continue
		case '"':
			w.i++
			return w.b[start : w.i-1], plainStr
		}
		w.i++
	}
}

// skip moves past the value at w.i, which the schema does not look into.
func (w *walker) skip() {
	depth := 0
	for {
		switch w.b[w.i] {
		case '"':
			w.raw()
		case '{', '[':
			depth++
			w.i++
		case '}', ']':
			depth--
			w.i++
		default:
			if depth == 0 {
				// A literal or number: up to the next delimiter.
				for w.i < len(w.b) && !delimiter(w.b[w.i]) {
					w.i++
				}
				return
			}
			w.i++
		}
		if depth == 0 {
			return
		}
	}
}

// delimiter reports the bytes that can end a number or a literal.
func delimiter(c byte) bool {
	switch c {
	case ' ', '\t', '\r', '\n', ',', ']', '}', ':':
		return true
	}
	return false
}

// maxInPlace bounds the chain of schemas ($ref, allOf) applied to one value
// that vouchJSON follows: a longer chain is most likely a reference loop, which
// the library reports as an error, so vouchJSON leaves it to the library.
const maxInPlace = 32

// plain reports that s uses no keyword vouchJSON does not check.
func plain(s *jsonschema.Schema) bool {
	return s.Format == "" && !s.RecursiveAnchor && s.RecursiveRef == nil && s.DynamicRef == nil && s.DynamicAnchor == "" &&
		s.Not == nil && len(s.AnyOf) == 0 && len(s.OneOf) == 0 && s.If == nil && s.Then == nil && s.Else == nil &&
		s.PropertyNames == nil && !s.RegexProperties && len(s.PatternProperties) == 0 &&
		len(s.Dependencies) == 0 && len(s.DependentRequired) == 0 && len(s.DependentSchemas) == 0 && s.UnevaluatedProperties == nil &&
		!s.UniqueItems && s.AdditionalItems == nil && len(s.PrefixItems) == 0 && s.Contains == nil && s.MaxContains == -1 && s.UnevaluatedItems == nil &&
		s.ContentEncoding == "" && s.ContentMediaType == "" && s.ContentSchema == nil &&
		s.MultipleOf == nil && len(s.Extensions) == 0
}

// integral reports a number written as an integer ([-]digits); the
// library finds more integers (1.0, 1e2), which are left to it.
func integral(s string) bool {
	if s != "" && s[0] == '-' {
		s = s[1:]
	}
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// withinBounds checks x against the integer bounds of s, each within
// int64; any other bound is left to the library.
func withinBounds(s *jsonschema.Schema, x int64) bool {
	if s.Minimum != nil {
		b, ok := int64Of(s.Minimum)
		if !ok || x < b {
			return false
		}
	}
	if s.ExclusiveMinimum != nil {
		b, ok := int64Of(s.ExclusiveMinimum)
		if !ok || x <= b {
			return false
		}
	}
	if s.Maximum != nil {
		b, ok := int64Of(s.Maximum)
		if !ok || x > b {
			return false
		}
	}
	if s.ExclusiveMaximum != nil {
		b, ok := int64Of(s.ExclusiveMaximum)
		if !ok || x >= b {
			return false
		}
	}
	return true
}

// int64Of is r as an int64, when r is an integer that fits one.
func int64Of(r *big.Rat) (int64, bool) {
	if !r.IsInt() || !r.Num().IsInt64() {
		return 0, false
	}
	return r.Num().Int64(), true
}

// sameString is the library's equality where both values are strings, and
// false (the library decides) otherwise.
func sameString(v, want any) bool {
	a, ok := v.(string)
	b, ok2 := want.(string)
	return ok && ok2 && a == b
}

func inEnum(v any, enum []any) bool {
	for _, item := range enum {
		if sameString(v, item) {
			return true
		}
	}
	return false
}
