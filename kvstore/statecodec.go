package kvstore

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/klauspost/compress/zstd"
)

// Checkpoint state encoding (docs/checkpoints.md). zstd was measured
// against gzip on JSON states here (BenchmarkStateCompression): it writes
// smaller output several times faster, and reads faster still.
const (
	// compressAbove is the state size from which the stored bytes are
	// compressed.
	compressAbove = 10 << 10
	// deltaAbove is the state size from which a checkpoint is stored as a
	// merge patch against its parent, when that is smaller.
	deltaAbove = 100 << 10
	// maxDeltaDepth bounds a chain of deltas: restoring reads every link.
	maxDeltaDepth = 16
	// maxCheckpointBytes bounds one checkpoint's state.
	maxCheckpointBytes = 16 << 20
)

// Encodings of stored state.
const (
	encJSON = "json"
	encZstd = "zstd"
)

var (
	zenc     *zstd.Encoder
	zdec     *zstd.Decoder
	zstdOnce sync.Once
	zstdErr  error
)

// zstdCodec returns the shared encoder and decoder; EncodeAll and DecodeAll
// may be called concurrently.
func zstdCodec() (*zstd.Encoder, *zstd.Decoder, error) {
	zstdOnce.Do(func() {
		zenc, zstdErr = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
		if zstdErr != nil {
			return
		}
		zdec, zstdErr = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0),
			zstd.WithDecoderMaxMemory(2*maxCheckpointBytes), zstd.WithDecoderMaxWindow(maxCheckpointBytes))
	})
	return zenc, zdec, zstdErr
}

func compressState(b []byte) ([]byte, error) {
	enc, _, err := zstdCodec()
	if err != nil {
		return nil, err
	}
	return enc.EncodeAll(b, make([]byte, 0, len(b)/4)), nil
}

func decompressState(b []byte) ([]byte, error) {
	_, dec, err := zstdCodec()
	if err != nil {
		return nil, err
	}
	out, err := dec.DecodeAll(b, nil)
	if err != nil {
		return nil, err
	}
	if len(out) > maxCheckpointBytes {
		return nil, fmt.Errorf("state of %d bytes is over the %d byte limit", len(out), maxCheckpointBytes)
	}
	return out, nil
}

// compactState returns state without insignificant whitespace (key order
// and number spelling kept), the form checkpoints store and restore.
func compactState(state []byte) ([]byte, error) {
	var buf bytes.Buffer
	buf.Grow(len(state))
	if err := json.Compact(&buf, state); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// makeDelta returns an RFC 7386 merge patch turning parent into state, or
// ok false when a delta does not pay or would not give state back byte for
// byte (a merge patch cannot set a member to null, and a member added
// before others changes the order): the state is then stored whole.
func makeDelta(parent, state []byte) (patch []byte, ok bool) {
	patch, err := jsonpatch.CreateMergePatch(parent, state)
	if err != nil || len(patch) >= len(state)/2 {
		return nil, false
	}
	var p, base any
	if json.Unmarshal(patch, &p) != nil || json.Unmarshal(parent, &base) != nil || !orderFree(base, p) {
		return nil, false
	}
	back, err := jsonpatch.MergePatch(parent, patch)
	if err != nil || !bytes.Equal(back, state) {
		return nil, false
	}
	return patch, true
}

// orderFree reports whether applying patch to doc appends at most one new
// member to any object. The library appends new members in map order, so
// two or more would come back in an order that varies from run to run.
func orderFree(doc, patch any) bool {
	p, ok := patch.(map[string]any)
	if !ok {
		return true
	}
	d, _ := doc.(map[string]any)
	added := 0
	for k, v := range p {
		cur, exists := d[k]
		if !exists || cur == nil {
			if v != nil {
				added++
			}
			continue
		}
		if !orderFree(cur, v) {
			return false
		}
	}
	return added <= 1
}

// applyDelta applies a stored merge patch to its parent's state.
func applyDelta(parent, patch []byte) ([]byte, error) {
	return jsonpatch.MergePatch(parent, patch)
}
