package kvstore_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/kvstore"
)

// benchState is a JSON state of about n bytes shaped like a tool's
// progress: records with ids, words and numbers.
func benchState(n int) []byte {
	rng := rand.New(rand.NewPCG(7, 7))
	words := []string{"parsed", "file", "src/main.go", "ok", "warning", "line", "token", "function", "error", "done"}
	var rows []map[string]any
	size := 0
	for i := 0; size < n; i++ {
		r := map[string]any{"id": i, "path": fmt.Sprintf("pkg/%d/file_%d.go", rng.IntN(50), i),
			"status": words[rng.IntN(len(words))], "score": rng.Float64(), "note": words[rng.IntN(len(words))] + " " + words[rng.IntN(len(words))]}
		b, _ := json.Marshal(r)
		size += len(b) + 1
		rows = append(rows, r)
	}
	b, _ := json.Marshal(map[string]any{"rows": rows})
	return b
}

// BenchmarkStateCompression measures the two codecs the specification
// names on a checkpoint-like JSON state (docs/checkpoints.md).
func BenchmarkStateCompression(b *testing.B) {
	state := benchState(100 << 10)
	enc, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
	dec, _ := zstd.NewReader(nil)
	z := enc.EncodeAll(state, nil)
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	_, _ = w.Write(state)
	_ = w.Close()
	b.Run("zstd/compress", func(b *testing.B) {
		b.SetBytes(int64(len(state)))
		for b.Loop() {
			enc.EncodeAll(state, nil)
		}
		b.ReportMetric(float64(len(z))/float64(len(state)), "ratio")
	})
	b.Run("gzip/compress", func(b *testing.B) {
		b.SetBytes(int64(len(state)))
		for b.Loop() {
			var buf bytes.Buffer
			w := gzip.NewWriter(&buf)
			_, _ = w.Write(state)
			_ = w.Close()
		}
		b.ReportMetric(float64(gz.Len())/float64(len(state)), "ratio")
	})
	b.Run("zstd/decompress", func(b *testing.B) {
		b.SetBytes(int64(len(state)))
		for b.Loop() {
			if _, err := dec.DecodeAll(z, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("gzip/decompress", func(b *testing.B) {
		b.SetBytes(int64(len(state)))
		for b.Loop() {
			r, _ := gzip.NewReader(bytes.NewReader(gz.Bytes()))
			var out bytes.Buffer
			if _, err := out.ReadFrom(r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCheckpoint writes and restores checkpoints of 1 KiB, 100 KiB
// and 10 MiB beside a bare put and get of the same bytes in a bucket (in
// chunks of the same size where one value cannot hold them).
func BenchmarkCheckpoint(b *testing.B) {
	_, js := natstest.JetStream(b)
	ctx := context.Background()
	s, err := kvstore.Open(ctx, js, kvstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	bare, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bench_bare", History: 1})
	if err != nil {
		b.Fatal(err)
	}
	const chunk = 512 << 10
	for _, size := range []struct {
		name string
		n    int
	}{{"1KiB", 1 << 10}, {"100KiB", 100 << 10}, {"10MiB", 10 << 20}} {
		state := benchState(size.n)
		seq := 0
		var last string
		b.Run(size.name+"/checkpoint-write", func(b *testing.B) {
			b.SetBytes(int64(len(state)))
			for b.Loop() {
				seq++
				cp, err := s.SaveCheckpoint(ctx, api.Checkpoint{Tenant: "bench", InvocationID: size.name, Seq: seq, Kind: api.CheckpointMicro}, state, nil)
				if err != nil {
					b.Fatal(err)
				}
				last = cp.ID
				b.ReportMetric(float64(cp.StoredBytes), "stored-bytes")
			}
		})
		b.Run(size.name+"/checkpoint-restore", func(b *testing.B) {
			b.SetBytes(int64(len(state)))
			for b.Loop() {
				if _, _, err := s.LoadCheckpoint(ctx, "bench", last); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(size.name+"/bare-put", func(b *testing.B) {
			b.SetBytes(int64(len(state)))
			for b.Loop() {
				for i := 0; i*chunk < len(state); i++ {
					if _, err := bare.Put(ctx, fmt.Sprintf("%s.%d", size.name, i), state[i*chunk:min(len(state), (i+1)*chunk)]); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		b.Run(size.name+"/bare-get", func(b *testing.B) {
			b.SetBytes(int64(len(state)))
			for b.Loop() {
				for i := 0; i*chunk < len(state); i++ {
					if _, err := bare.Get(ctx, fmt.Sprintf("%s.%d", size.name, i)); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
