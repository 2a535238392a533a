package kvstore

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzStateCodec: for any two JSON states a delta, when one is taken,
// gives the second back byte for byte from the first; stored bytes that
// are not zstd are refused without a panic.
func FuzzStateCodec(f *testing.F) {
	f.Add([]byte(`{"a":1,"b":[1,2]}`), []byte(`{"a":2,"b":[1,2],"c":null}`))
	f.Add([]byte(`{"k":{"x":"`+string(bytes.Repeat([]byte("y"), 300))+`"}}`), []byte(`{"k":{"x":"z"}}`))
	f.Add([]byte(`[1]`), []byte(`{"a":{"b":{"c":1,"d":2}}}`))
	f.Fuzz(func(t *testing.T, parent, state []byte) {
		_, _ = decompressState(state)
		p, err1 := compactState(parent)
		s, err2 := compactState(state)
		if err1 != nil || err2 != nil {
			return
		}
		patch, ok := makeDelta(p, s)
		if !ok {
			return
		}
		back, err := applyDelta(p, patch)
		if err != nil || !bytes.Equal(back, s) || !json.Valid(back) {
			t.Fatalf("parent %s, state %s: patch %s gives %s, %v", p, s, patch, back, err)
		}
	})
}
