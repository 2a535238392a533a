package kvstore

import (
	"context"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
)

// BenchmarkBound is what bounding one bucket operation costs: under a
// context the stages share (validate's, audit's), and under one of a
// call's own (execute's), against making that context alone (own
// unbounded).
func BenchmarkBound(b *testing.B) {
	kv := newBounded(nil, DefaultOpTimeout)
	shared, stop := context.WithDeadline(context.Background(), time.Now().Add(time.Hour))
	defer stop()
	b.Run("shared", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ctx, cancel := kv.bound(shared)
			<-ctxDone(ctx)
			cancel()
		}
	})
	b.Run("own unbounded", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			own, end := context.WithCancelCause(shared)
			<-ctxDone(own)
			end(nil)
		}
	})
	b.Run("own", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			own, end := context.WithCancelCause(shared)
			ctx, cancel := kv.bound(own)
			<-ctxDone(ctx)
			cancel()
			end(nil)
		}
	})
}

// ctxDone returns a closed channel after touching ctx's Done, as nats.go's
// select does.
func ctxDone(ctx context.Context) <-chan struct{} {
	select {
	case <-ctx.Done():
	default:
	}
	return closed
}

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// BenchmarkRemember is what remembering a written status record costs.
func BenchmarkRemember(b *testing.B) {
	var r recentWrites
	rec := api.Record{InvocationID: "inv-1", Tenant: "acme", Agent: "did:agent:a", Status: api.StatusPending, Seq: 1, Digest: "d",
		ToolID: "echo", UpdatedAt: time.Now().UTC()}
	val, err := encodeValue(&rec)
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 8192)
	for i := range keys {
		keys[i] = invocationKey("acme", "inv-"+string(rune('a'+i%26))+string(rune('a'+i/26%26))+string(rune('a'+i/676)))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r.put(keys[i%len(keys)], uint64(i), val, &rec)
		i++
	}
}

// BenchmarkEncodeRecord is the encoding of a claimed status record.
func BenchmarkEncodeRecord(b *testing.B) {
	rec := api.Record{InvocationID: "inv-1", Tenant: "acme", Agent: "did:agent:a", Status: api.StatusPending, Seq: 1, Digest: "d",
		ToolID: "echo", UpdatedAt: time.Now().UTC()}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := encodeValue(&rec); err != nil {
			b.Fatal(err)
		}
	}
}
