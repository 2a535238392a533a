package envelope

import (
	"bytes"
	"fmt"
	"reflect"
	"sync"
	"time"
	"unsafe"

	segjson "github.com/segmentio/encoding/json"
)

// Encode is the hand-off encoding of inv (runner.Handoff), written on
// every hop: JSON, by github.com/segmentio/encoding/json, in half the
// time of encoding/json. Its bytes differ from encoding/json's in one
// way a reader cannot tell: it writes the zero values of omitzero fields,
// which Decode (and encoding/json) read back as zero; FuzzEncode holds it
// to reading back as encoding/json's encoding does. Its own hashes and
// signatures (seal digests, principals) do not read these bytes.
//
// Once authorize has sealed the call, its request, principal and
// authorization no longer change (execute refuses a call whose request or
// authorization differs from the seal's digests): their bytes from the
// last Encode of inv are written again as they were, and the rest of the
// envelope is encoded around them in the same order, so the bytes are
// those segmentio's codec writes of the whole envelope. A result that
// holds, byte for byte, what the last Encode wrote of it is written again
// too, without its scan: the codec writes its own output unchanged.
func Encode(inv *Invocation) ([]byte, error) {
	if inv.Authz == nil || inv.Authz.Seal == nil {
		return segjson.Marshal(inv)
	}
	buf := encodeBuffers.Get().(*[]byte)
	b, kept, err := encodeKept(inv, (*buf)[:0])
	var out []byte
	if err == nil {
		out = bytes.Clone(b)
	}
	if cap(b) <= maxKeptBuffer {
		*buf = b // given back once copied
		encodeBuffers.Put(buf)
	}
	if err != nil {
		inv.kept = nil
		return nil, err
	}
	// What is kept points into out, which stays as it is: a hand-off's
	// bytes are published and held, never written again.
	for i := range kept.parts {
		p := &kept.parts[i]
		if p.ptr != nil {
			p.data = out[p.at : p.at+len(p.data) : p.at+len(p.data)]
		}
	}
	if n := len(kept.headData); n > 0 {
		kept.headData = out[1 : 1+n : 1+n] // right after the brace
	}
	inv.kept = kept
	return out, nil
}

// encodeBuffers are the buffers Encode writes into before the copy it
// returns, reused from hop to hop.
var encodeBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// maxKeptBuffer bounds the buffers kept for reuse: one grown by a large
// result is left to the collector.
const maxKeptBuffer = 1 << 20

// kept is what Encode keeps of the parts it wrote of an invocation: each
// part's pointer and its bytes, written again as long as the invocation
// holds the same pointer; and the fields before them (head), written
// again as long as they hold the same values.
type kept struct {
	// sig is the seal's signature they were written under: a seal made
	// again, over a request or authorization changed in place, writes them
	// afresh.
	sig   string
	parts [len(keptFields)]keptPart
	head  headFields
	// headData is head's encoding, at 1 in the envelope's; nil: none kept.
	headData []byte
}

// headFields are the values of Invocation's fields before Request that
// no hop after validate changes, but for Data, which is then empty: all
// of them comparable, so that one comparison tells whether the bytes
// written of them last can be written again (invocationLayout holds them
// to Invocation's fields).
type headFields struct {
	ID          string
	Tenant      string
	Event       Event
	ReceivedAt  time.Time
	TraceParent string
	TraceState  string
	Origin      TraceContext
}

// headOf is inv's head, and whether it can be kept (no Data).
func headOf(inv *Invocation) (headFields, bool) {
	return headFields{inv.ID, inv.Tenant, inv.Event, inv.ReceivedAt, inv.TraceParent, inv.TraceState, inv.Origin}, len(inv.Data) == 0
}

type keptPart struct {
	// ptr is the part's value when it was written (Request, Principal,
	// Authz), or the result's first byte: nil, a part omitted.
	ptr  unsafe.Pointer
	data []byte
	at   int // where data starts in the encoding
}

// keptFields are the fields whose bytes Encode keeps, in their order in
// Invocation. Result, the last, is kept by its bytes (keptResult), not
// by its pointer: a stage may change a result in place.
var keptFields = [...]string{"Request", "Principal", "Authz", "Result"}

// keptResult is Result's index in keptFields.
const keptResult = len(keptFields) - 1

// keptParts are the pointers of inv's kept fields, in keptFields' order;
// nil for one omitted (omitempty).
func keptParts(inv *Invocation) [len(keptFields)]unsafe.Pointer {
	var result unsafe.Pointer
	if len(inv.Result) > 0 {
		result = unsafe.Pointer(unsafe.SliceData(inv.Result))
	}
	return [...]unsafe.Pointer{unsafe.Pointer(inv.Request), unsafe.Pointer(inv.Principal), unsafe.Pointer(inv.Authz), result}
}

// sameAsKept reports whether prev's bytes of kept field r can be written
// for inv's: the same pointer, or for the result the very bytes written
// (the codec writes a result it wrote as it is: compact, HTML escaped).
func sameAsKept(prev *kept, r int, inv *Invocation, ptr unsafe.Pointer) bool {
	if prev == nil || prev.parts[r].ptr == nil {
		return false
	}
	if r == keptResult {
		return bytes.Equal(prev.parts[r].data, inv.Result)
	}
	return prev.parts[r].ptr == ptr
}

// A layout is how Encode writes an Invocation: its kept fields one by
// one, and the runs of other fields between them, each encoded as a struct
// type of Invocation's very fields (so the same memory) with every field
// outside the run untagged ("-").
type layout struct {
	runs [len(keptFields) + 1]reflect.Type
	// ptrs are the runs' pointer types, as the type words of an
	// interface holding one: reflect.NewAt would look each up on every
	// run of every hop. nil: a run of no fields, which writes nothing.
	ptrs [len(keptFields) + 1]unsafe.Pointer
	keys [len(keptFields)]string // `"request":` and so on
}

var invocationLayout = sync.OnceValue(func() *layout {
	t := reflect.TypeFor[Invocation]()
	l := &layout{}
	idx := make([]int, 0, len(keptFields)+2)
	idx = append(idx, -1)
	for i, name := range keptFields {
		f, ok := t.FieldByName(name)
		if !ok || len(f.Index) != 1 {
			panic("envelope: Invocation has no field " + name)
		}
		if n := f.Index[0]; n <= idx[len(idx)-1] {
			panic("envelope: keptFields out of Invocation's order")
		}
		idx = append(idx, f.Index[0])
		key, _, _ := bytes.Cut([]byte(f.Tag.Get("json")), []byte(","))
		l.keys[i] = fmt.Sprintf("%q:", key)
	}
	idx = append(idx, t.NumField())
	for r := range l.runs {
		fields := make([]reflect.StructField, t.NumField())
		for i := range fields {
			f := t.Field(i)
			fields[i] = reflect.StructField{Name: f.Name, Type: f.Type, Tag: `json:"-"`}
			if i > idx[r] && i < idx[r+1] && f.IsExported() {
				fields[i].Tag = f.Tag
			}
			if !f.IsExported() {
				fields[i].Name, fields[i].PkgPath = "X"+f.Name, ""
			}
		}
		rt := reflect.StructOf(fields)
		tagged := false
		for i := range fields {
			if rt.Field(i).Offset != t.Field(i).Offset || rt.Size() != t.Size() {
				panic("envelope: a run of Invocation is laid out differently")
			}
			tagged = tagged || fields[i].Tag != `json:"-"`
		}
		l.runs[r] = rt
		if tagged {
			v := reflect.New(rt).Interface()
			l.ptrs[r] = (*eface)(unsafe.Pointer(&v)).typ
		}
	}
	// The head kept is the first run, Data aside.
	h := reflect.TypeFor[headFields]()
	n := 0
	for i := range idx[1] {
		f := t.Field(i)
		if !f.IsExported() || f.Name == "Data" {
			continue
		}
		if n >= h.NumField() || h.Field(n).Name != f.Name || h.Field(n).Type != f.Type {
			panic("envelope: headFields are not Invocation's fields before Request")
		}
		n++
	}
	if n != h.NumField() {
		panic("envelope: headFields are not Invocation's fields before Request")
	}
	return l
})

// eface is the layout of an interface value.
type eface struct{ typ, data unsafe.Pointer }

// encodeKept appends inv's encoding to b: each run of fields between the
// kept ones by segmentio's codec, each kept field from inv.kept when inv
// still holds what was written there, and encoded otherwise.
func encodeKept(inv *Invocation, b []byte) ([]byte, *kept, error) {
	l := invocationLayout()
	prev := inv.kept
	sig := inv.Authz.Seal.Sig
	if prev != nil && (prev.sig != sig || sig == "") {
		prev = nil
	}
	next := prev // reused: each part is read before it is written over
	if next == nil {
		next = &kept{}
	}
	next.sig = sig
	ptrs := keptParts(inv)
	start := len(b)
	b = append(b, '{')
	head, keepHead := headOf(inv)
	for r := range l.runs {
		var err error
		switch {
		case r == 0 && keepHead && prev != nil && prev.headData != nil && prev.head == head:
			b = append(b, prev.headData...)
		case l.ptrs[r] != nil:
			at := len(b)
			if b, err = appendRun(b, l.ptrs[r], inv); err != nil {
				return b, nil, err
			}
			if r == 0 {
				next.head, next.headData = head, nil
				if keepHead && len(b) > at {
					next.headData = b[at:len(b):len(b)]
				}
			}
		}
		if r == len(l.keys) {
			break
		}
		if ptrs[r] == nil {
			next.parts[r] = keptPart{}
			continue // omitempty
		}
		if b[len(b)-1] != '{' {
			b = append(b, ',')
		}
		b = append(b, l.keys[r]...)
		at := len(b)
		if sameAsKept(prev, r, inv, ptrs[r]) {
			b = append(b, prev.parts[r].data...)
		} else if b, err = segjson.Append(b, keptValue(inv, r), segjson.EscapeHTML|segjson.SortMapKeys); err != nil {
			return b, nil, err
		}
		next.parts[r] = keptPart{ptr: ptrs[r], data: b[at:len(b):len(b)], at: at - start}
	}
	return append(b, '}'), next, nil
}

// keptValue is inv's kept field r, typed, for the codec.
func keptValue(inv *Invocation, r int) any {
	switch r {
	case 0:
		return inv.Request
	case 1:
		return inv.Principal
	case 2:
		return inv.Authz
	}
	return inv.Result
}

// appendRun appends the fields of inv that the run of pointer type ptr
// encodes, without their braces, after a comma when b holds a field
// already.
func appendRun(b []byte, ptr unsafe.Pointer, inv *Invocation) ([]byte, error) {
	at := len(b)
	v := eface{typ: ptr, data: unsafe.Pointer(inv)}
	b, err := segjson.Append(b, *(*any)(unsafe.Pointer(&v)), segjson.EscapeHTML|segjson.SortMapKeys)
	if err != nil {
		return b, err
	}
	run := b[at+1 : len(b)-1] // within the braces
	if len(run) == 0 {
		return b[:at], nil
	}
	if b[at-1] != '{' {
		b[at] = ','
		return b[:len(b)-1], nil
	}
	copy(b[at:], run)
	return b[:at+len(run)], nil
}
