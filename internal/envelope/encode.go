package envelope

import (
	"bytes"
	"fmt"
	"reflect"
	"sync"
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
// those segmentio's codec writes of the whole envelope.
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
// holds the same pointer.
type kept struct {
	// sig is the seal's signature they were written under: a seal made
	// again, over a request or authorization changed in place, writes them
	// afresh.
	sig   string
	parts [len(keptFields)]keptPart
}

type keptPart struct {
	ptr  unsafe.Pointer // the part's value when it was written (Request, Principal, Authz)
	data []byte
	at   int // where data starts in the encoding
}

// keptFields are the fields whose bytes Encode keeps, in their order in
// Invocation.
var keptFields = [...]string{"Request", "Principal", "Authz"}

// keptParts are the pointers of inv's kept fields, in keptFields' order.
func keptParts(inv *Invocation) [len(keptFields)]unsafe.Pointer {
	return [...]unsafe.Pointer{unsafe.Pointer(inv.Request), unsafe.Pointer(inv.Principal), unsafe.Pointer(inv.Authz)}
}

// A layout is how Encode writes an Invocation: its kept fields one by
// one, and the runs of other fields between them, each encoded as a struct
// type of Invocation's very fields (so the same memory) with every field
// outside the run untagged ("-").
type layout struct {
	runs [len(keptFields) + 1]reflect.Type
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
		for i := range fields {
			if rt.Field(i).Offset != t.Field(i).Offset || rt.Size() != t.Size() {
				panic("envelope: a run of Invocation is laid out differently")
			}
		}
		l.runs[r] = rt
	}
	return l
})

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
	for r, rt := range l.runs {
		var err error
		if b, err = appendRun(b, rt, inv); err != nil {
			return b, nil, err
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
		if prev != nil && prev.parts[r].ptr == ptrs[r] {
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
	}
	return inv.Authz
}

// appendRun appends the fields of inv that run rt encodes, without their
// braces, after a comma when b holds a field already.
func appendRun(b []byte, rt reflect.Type, inv *Invocation) ([]byte, error) {
	at := len(b)
	b, err := segjson.Append(b, reflect.NewAt(rt, unsafe.Pointer(inv)).Interface(), segjson.EscapeHTML|segjson.SortMapKeys)
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
