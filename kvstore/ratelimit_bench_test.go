package kvstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/kvstore"
)

// BenchmarkUpdateBucket is one write of a rate-limit bucket as a route
// worker makes it when its lease runs out: a token taken and the calls
// its last lease gave recorded, in a bucket that remembers the most it
// can (kvstore.TookMemory); the server included.
func BenchmarkUpdateBucket(b *testing.B) {
	_, js := natstest.JetStream(b)
	s, err := kvstore.Open(context.Background(), js, kvstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	ids := make([]string, 2*kvstore.TookMemory)
	for i := range ids {
		ids[i] = "inv-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if _, err := s.UpdateBucket(ctx, "acme", "echo", func(bk *kvstore.Bucket, exists bool) error {
			if !exists {
				bk.Tokens = 1e9
			}
			bk.Tokens--
			bk.At = time.Now()
			for i := range 16 {
				bk.Take(ids[(n+i)%len(ids)])
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		n += 16
	}
}
