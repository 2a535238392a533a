package schemas

import (
	"encoding/json"
	"math/big"
	"strconv"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// maxInPlace bounds the chain of schemas ($ref, allOf) applied to one value
// that vouch follows: a longer chain is most likely a reference loop, which
// the library reports as an error, so vouch leaves it to the library.
const maxInPlace = 32

// vouch reports, by a plain walk over a value decode made, that the library
// would find v valid against s. It knows the keywords toolgate's own schemas
// and most tools' input schemas use (type, enum, const, properties,
// required, additionalProperties, items, string lengths and pattern,
// integer bounds, $ref, allOf) and checks each exactly as the library does,
// or more strictly; anything else, and anything that fails, it leaves to
// the library, whose verdict and field errors stand. A valid document thus
// skips the library's bookkeeping (instance locations, evaluated-property
// sets), which costs several times the walk.
func vouch(s *jsonschema.Schema, v any, inPlace int) bool {
	if inPlace > maxInPlace || !plain(s) {
		return false
	}
	if s.Always != nil {
		return *s.Always
	}
	if len(s.Types) > 0 && !hasType(s.Types, v) {
		return false
	}
	if len(s.Constant) > 0 && !sameString(v, s.Constant[0]) {
		return false
	}
	if len(s.Enum) > 0 && !inEnum(v, s.Enum) {
		return false
	}
	switch v := v.(type) {
	case map[string]any:
		if !vouchObject(s, v) {
			return false
		}
	case []any:
		if s.MinItems != -1 && len(v) < s.MinItems || s.MaxItems != -1 && len(v) > s.MaxItems {
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
		if items != nil {
			for _, item := range v {
				if !vouch(items, item, 0) {
					return false
				}
			}
		}
	case string:
		if s.MinLength != -1 || s.MaxLength != -1 {
			n := utf8.RuneCountInString(v)
			if s.MinLength != -1 && n < s.MinLength || s.MaxLength != -1 && n > s.MaxLength {
				return false
			}
		}
		if s.Pattern != nil && !s.Pattern.MatchString(v) {
			return false
		}
	case json.Number:
		if !vouchNumber(s, v) {
			return false
		}
	case bool, nil:
	default:
		return false // not what decode makes
	}
	if s.Ref != nil && !vouch(s.Ref, v, inPlace+1) {
		return false
	}
	for _, sch := range s.AllOf {
		if !vouch(sch, v, inPlace+1) {
			return false
		}
	}
	return true
}

// plain reports that s uses no keyword vouch does not check.
func plain(s *jsonschema.Schema) bool {
	return s.Format == "" && !s.RecursiveAnchor && s.RecursiveRef == nil && s.DynamicRef == nil && s.DynamicAnchor == "" &&
		s.Not == nil && len(s.AnyOf) == 0 && len(s.OneOf) == 0 && s.If == nil && s.Then == nil && s.Else == nil &&
		s.PropertyNames == nil && !s.RegexProperties && len(s.PatternProperties) == 0 &&
		len(s.Dependencies) == 0 && len(s.DependentRequired) == 0 && len(s.DependentSchemas) == 0 && s.UnevaluatedProperties == nil &&
		!s.UniqueItems && s.AdditionalItems == nil && len(s.PrefixItems) == 0 && s.Contains == nil && s.MaxContains == -1 && s.UnevaluatedItems == nil &&
		s.ContentEncoding == "" && s.ContentMediaType == "" && s.ContentSchema == nil &&
		s.MultipleOf == nil && len(s.Extensions) == 0
}

func vouchObject(s *jsonschema.Schema, v map[string]any) bool {
	if s.MinProperties != -1 && len(v) < s.MinProperties || s.MaxProperties != -1 && len(v) > s.MaxProperties {
		return false
	}
	for _, name := range s.Required {
		if _, ok := v[name]; !ok {
			return false
		}
	}
	var extra *jsonschema.Schema
	closed := false
	switch a := s.AdditionalProperties.(type) {
	case nil:
	case bool:
		closed = !a
	case *jsonschema.Schema:
		extra = a
	default:
		return false
	}
	for name, val := range v {
		sch, ok := s.Properties[name]
		switch {
		case ok:
		case closed:
			return false
		case extra == nil:
			continue
		default:
			sch = extra
		}
		if !vouch(sch, val, 0) {
			return false
		}
	}
	return true
}

// hasType is the library's type check, but a number is an integer only when
// written as one ([-]digits); 1.0 or 1e2 are left to the library.
func hasType(types []string, v any) bool {
	var t string
	switch v := v.(type) {
	case nil:
		t = "null"
	case bool:
		t = "boolean"
	case string:
		t = "string"
	case map[string]any:
		t = "object"
	case []any:
		t = "array"
	case json.Number:
		t = "number"
		if integral(v) {
			for _, want := range types {
				if want == "integer" {
					return true
				}
			}
		}
	default:
		return false
	}
	for _, want := range types {
		if want == t {
			return true
		}
	}
	return false
}

func integral(n json.Number) bool {
	s := string(n)
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

// vouchNumber checks the bounds of an integer against integer bounds, both
// within int64; any other number or bound is left to the library.
func vouchNumber(s *jsonschema.Schema, n json.Number) bool {
	if s.Minimum == nil && s.Maximum == nil && s.ExclusiveMinimum == nil && s.ExclusiveMaximum == nil {
		return true
	}
	if !integral(n) {
		return false
	}
	x, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil {
		return false
	}
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
