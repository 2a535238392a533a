package kvstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/kvstore"
)

// TestToolStatsShardsMerge: several processes (recorders) count calls of
// one tool at once, each in its own shard; the merged totals are exact and
// the percentiles come from the merged histogram.
func TestToolStatsShardsMerge(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	recs := []*kvstore.StatsRecorder{s.NewStatsRecorder(), s.NewStatsRecorder(), s.NewStatsRecorder()}
	var wg sync.WaitGroup
	for _, r := range recs {
		for j := range 8 {
			wg.Go(func() {
				for k := range 25 {
					ms := int64(3) // 3 ms: the 5 ms bucket
					if (j*25+k)%10 == 0 {
						ms = 700 // one call in ten: the 1000 ms bucket
					}
					if err := r.Record(ctx, "mcp:fs:read_file", k%4 != 0, ms, 0.5); err != nil {
						t.Error(err)
					}
				}
			})
		}
	}
	wg.Wait()
	for _, r := range recs {
		if err := r.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	all, err := s.ToolStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sum := all["mcp:fs:read_file"].Summary("mcp:fs:read_file")
	if sum.Calls != 600 || sum.Successes != 432 || sum.Cost != 300 || sum.AvgCost != 0.5 || sum.SuccessRate != 0.72 {
		t.Fatalf("merged = %+v", sum)
	}
	if sum.P50MS != 5 || sum.P95MS != 1000 || sum.P99MS != 1000 {
		t.Fatalf("percentiles p50 %v p95 %v p99 %v", sum.P50MS, sum.P95MS, sum.P99MS)
	}
}

// TestToolStatsWritesCoalesced: the first call of a quiet recorder is
// written at once; a burst after it costs one more write, StatsEvery
// later, which counts every call of the burst.
func TestToolStatsWritesCoalesced(t *testing.T) {
	s, js := open(t)
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, kvstore.BucketToolStats)
	if err != nil {
		t.Fatal(err)
	}
	r := s.NewStatsRecorder()
	calls := func() int64 {
		all, err := s.ToolStats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return all["echo"].Summary("echo").Calls
	}
	if err := r.Record(ctx, "echo", true, 1, 0); err != nil {
		t.Fatal(err)
	}
	if got := calls(); got != 1 {
		t.Fatalf("first call: %d counted, want it written at once", got)
	}
	before, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if err := r.Record(ctx, "echo", true, 1, 0); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for calls() != 101 {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls counted, want 101", calls())
		}
		time.Sleep(20 * time.Millisecond)
	}
	after, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if writes := after.(interface{ StreamInfo() *jetstream.StreamInfo }).StreamInfo().State.LastSeq -
		before.(interface{ StreamInfo() *jetstream.StreamInfo }).StreamInfo().State.LastSeq; writes > 2 {
		t.Fatalf("%d writes for a burst of 100 calls", writes)
	}
}
