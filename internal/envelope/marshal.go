package envelope

import (
	"encoding/json"
	"reflect"
	"strings"
	"sync"

	segjson "github.com/segmentio/encoding/json"
)

// Marshal is json.Marshal(v), byte for byte, made by
// github.com/segmentio/encoding/json (several times faster) whenever v lets
// that codec write the same bytes: it does not know omitzero, so a value
// with an omitzero field anywhere within is written by encoding/json. It
// serves encodings other builds recompute or compare (the seal's digests,
// audit events' data), which must not change with the codec; FuzzMarshal
// holds the two to the same bytes.
func Marshal(v any) ([]byte, error) {
	if v == nil || !fastValue(reflect.ValueOf(v)) {
		return json.Marshal(v)
	}
	return segjson.Marshal(v)
}

// A type's verdict: no omitzero within (fast), one within (slow), or an
// interface within, whose dynamic values decide (depends).
type verdict uint8

const (
	fast verdict = iota
	slow
	depends
)

// A plan is a type's verdict and, for one that depends, the indices of
// its fields (a struct's) that depend: the others need no look.
type plan struct {
	verdict
	fields []int
}

// plans caches typePlan per type.
var plans sync.Map // reflect.Type → *plan

func typePlan(t reflect.Type) *plan {
	if p, ok := plans.Load(t); ok {
		return p.(*plan)
	}
	p := &plan{verdict: walkType(t, map[reflect.Type]bool{})}
	if p.verdict == depends && t.Kind() == reflect.Struct {
		for i := range t.NumField() {
			if f := t.Field(i); exported(f) && walkType(f.Type, map[reflect.Type]bool{}) == depends {
				p.fields = append(p.fields, i)
			}
		}
	}
	plans.Store(t, p)
	return p
}

// exported reports whether encoding/json writes field f (or its fields).
func exported(f reflect.StructField) bool {
	return f.Tag.Get("json") != "-" && (f.IsExported() || f.Anonymous)
}

func walkType(t reflect.Type, seen map[reflect.Type]bool) verdict {
	if seen[t] {
		return fast // a recursive type: its verdict is being reached above
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Interface:
		return depends
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return walkType(t.Elem(), seen)
	case reflect.Map:
		return max(walkType(t.Key(), seen), walkType(t.Elem(), seen))
	case reflect.Struct:
		out := fast
		for i := range t.NumField() {
			f := t.Field(i)
			if !exported(f) {
				continue
			}
			if _, opts, _ := strings.Cut(f.Tag.Get("json"), ","); strings.Contains(","+opts+",", ",omitzero,") {
				return slow
			}
			if out = max(out, walkType(f.Type, seen)); out == slow {
				return slow
			}
		}
		return out
	}
	return fast
}

// fastValue reports whether no omitzero field is reachable from v's
// encoding, looking into the values of its interfaces where its type
// holds any.
func fastValue(v reflect.Value) bool {
	p := typePlan(v.Type())
	switch p.verdict {
	case fast:
		return true
	case slow:
		return false
	}
	switch v.Kind() {
	case reflect.Interface, reflect.Pointer:
		return v.IsNil() || fastValue(v.Elem())
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if !fastValue(v.Index(i)) {
				return false
			}
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			if !fastValue(it.Key()) || !fastValue(it.Value()) {
				return false
			}
		}
	case reflect.Struct:
		for _, i := range p.fields {
			if !fastValue(v.Field(i)) {
				return false
			}
		}
	}
	return true
}
