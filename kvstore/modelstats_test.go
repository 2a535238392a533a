package kvstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/modelrouter"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/kvstore"
)

// TestModelStatsShardsMerge: two execute processes (two stores on their
// own connections, each with its recorder) count calls of one model and
// task type at once; the merged totals are exact, the failures are counted
// by class and the percentiles come from the merged histogram, both in the
// on-demand read and in the watched view routing uses.
func TestModelStatsShardsMerge(t *testing.T) {
	_, js := natstest.JetStream(t)
	ctx := context.Background()
	var stores []*kvstore.Store
	for range 2 {
		s, err := kvstore.Open(ctx, js, kvstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	watchCtx, stop := context.WithCancel(ctx)
	defer func() { stop(); stores[1].Wait() }()
	view, err := stores[1].WatchModelStats(watchCtx)
	if err != nil {
		t.Fatal(err)
	}
	// Process 0: 60 fast calls (100 ms), 8 of them timeouts. Process 1: 40
	// slow calls (1500 ms), 4 of them rate limited, and 10 of another task.
	recs := []*kvstore.ModelStatsRecorder{stores[0].NewModelStatsRecorder(), stores[1].NewModelStatsRecorder()}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 15 {
				o := modelrouter.Outcome{LatencyMS: 100, InputTokens: 10, OutputTokens: 5, Cost: 0.25}
				if i%10 == 0 {
					o.Failure = modelrouter.FailTimeout
				}
				recs[0].Record("gpt.small", "coding", o)
			}
			for i := range 10 {
				o := modelrouter.Outcome{LatencyMS: 1500, InputTokens: 20, OutputTokens: 10, Cost: 0.5}
				if i%10 == 0 {
					o.Failure = modelrouter.FailRateLimited
				}
				recs[1].Record("gpt.small", "coding", o)
			}
			if g == 0 {
				for range 10 {
					recs[1].Record("gpt.small", "", modelrouter.Outcome{LatencyMS: 3000})
				}
			}
		})
	}
	wg.Wait()
	for _, r := range recs {
		if err := r.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	all, err := stores[0].ModelStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := all[kvstore.ModelTask{Model: "gpt.small", TaskType: "coding"}]
	if got.Calls != 100 || got.Successes != 88 || got.Failures[modelrouter.FailTimeout] != 8 ||
		got.Failures[modelrouter.FailRateLimited] != 4 || got.InputTokens != 1400 || got.OutputTokens != 700 ||
		got.Cost != 35 || got.LatencyMS != 66000 {
		t.Fatalf("merged = %+v", got)
	}
	// 60 calls in the bucket of 100 ms (bound 113), 40 in that of 1500 ms
	// (bound 1522): the median is fast, the 95th percentile slow.
	if p50, p95 := got.Percentile(0.5), got.Percentile(0.95); p50 != 113 || p95 != 1522 {
		t.Fatalf("p50 %v p95 %v", p50, p95)
	}
	if none := all[kvstore.ModelTask{Model: "gpt.small", TaskType: kvstore.TaskTypeNone}]; none.Calls != 10 {
		t.Fatalf("calls without a task type: %+v", none)
	}
	// The view: the task type's own statistics when it has enough calls,
	// else the model's over every task type.
	eventually(t, 5*time.Second, "the view to see both shards", func() bool {
		o, ok := view.Observer("coding")("gpt.small")
		return ok && o.Calls == 100
	})
	o, _ := view.Observer("coding")("gpt.small")
	if o.SuccessRate != 0.88 || o.P50MS != 113 || o.P95MS != 1522 {
		t.Fatalf("observed for coding: %+v", o)
	}
	if o, ok := view.Observer("research")("gpt.small"); !ok || o.Calls != 110 {
		t.Fatalf("observed for a task type without calls: %+v %v", o, ok)
	}
	if _, ok := view.Observer("coding")("other"); ok {
		t.Fatal("a model without calls was observed")
	}
}

// TestModelStatsExpire: a shard nobody writes any more stops counting
// once the bucket's max age has passed since its last write, in the
// on-demand read and in the view; a recorder starts a new shard every
// third of the max age, so old calls age out of a live process too.
func TestModelStatsExpire(t *testing.T) {
	_, js := natstest.JetStream(t)
	ctx := context.Background()
	s, err := kvstore.Open(ctx, js, kvstore.Options{ModelStatsTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if s.ModelStatsTTL() != 3*time.Second {
		t.Fatalf("max age %v", s.ModelStatsTTL())
	}
	watchCtx, stop := context.WithCancel(ctx)
	defer func() { stop(); s.Wait() }()
	view, err := s.WatchModelStats(watchCtx)
	if err != nil {
		t.Fatal(err)
	}
	rec := s.NewModelStatsRecorder()
	var mu sync.Mutex
	now := time.Now()
	rec.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	rec.Record("m", "coding", modelrouter.Outcome{LatencyMS: 50})
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// A window later (1 s), the next call goes to a new shard.
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	rec.Record("m", "coding", modelrouter.Outcome{LatencyMS: 50})
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	all, err := s.ModelStats(ctx)
	if err != nil || all[kvstore.ModelTask{Model: "m", TaskType: "coding"}].Calls != 2 {
		t.Fatalf("before expiry: %+v %v", all, err)
	}
	if sh := all[kvstore.ModelTask{Model: "m", TaskType: "coding"}]; sh.Histogram[10] != 2 {
		t.Fatalf("two shards merged: %+v", sh)
	}
	eventually(t, 5*time.Second, "the view to hold both calls", func() bool {
		o, ok := view.Observer("coding")("m")
		return ok && o.Calls == 2
	})
	eventually(t, 15*time.Second, "the shards to expire", func() bool {
		all, err := s.ModelStats(ctx)
		return err == nil && len(all) == 0
	})
	eventually(t, 15*time.Second, "the view to drop them", func() bool {
		_, ok := view.Observer("coding")("m")
		return !ok
	})
}

// FuzzModelShard: the decoder of the model statistics bucket's values
// returns, never panics, and what it accepts adds up and survives a round
// trip and a merge.
func FuzzModelShard(f *testing.F) {
	var sh kvstore.ModelShard
	sh.Add(modelrouter.Outcome{LatencyMS: 120, InputTokens: 3, OutputTokens: 4, Cost: 0.1}, time.Unix(1e9, 0))
	sh.Add(modelrouter.Outcome{Failure: modelrouter.FailServer, LatencyMS: 9e6}, time.Unix(1e9, 0))
	good, _ := json.Marshal(sh)
	f.Add(good)
	f.Add([]byte(`{"v":1,"calls":0,"successes":0,"histogram":[]}`))
	f.Add([]byte(`{"v":1,"calls":1,"successes":0,"failures":{"nope":1}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := kvstore.DecodeModelShard(data)
		if err != nil {
			if !errors.Is(err, kvstore.ErrBadModelShard) {
				t.Fatalf("error %v is not ErrBadModelShard", err)
			}
			return
		}
		again, _ := json.Marshal(s)
		s2, err := kvstore.DecodeModelShard(again)
		if err != nil || s2.Calls != s.Calls {
			t.Fatalf("round trip: %v", err)
		}
		var m kvstore.ModelShard
		m.Merge(s)
		m.Merge(s2)
		if m.Calls != 2*s.Calls || m.Successes > m.Calls {
			t.Fatalf("merge: %+v", m)
		}
		if r := m.SuccessRate(); r < 0 || r > 1 {
			t.Fatalf("success rate %v", r)
		}
		if p := m.Percentile(0.5); p < 0 || p > float64(kvstore.ModelLatencyBoundsMS[len(kvstore.ModelLatencyBoundsMS)-1]) {
			t.Fatalf("p50 %v", p)
		}
	})
}

// eventually waits until cond holds, failing the test after d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestModelStatsFlushRetries: totals a failed flush could not write, of
// the current window and of one that ended meanwhile, are written by the
// next flush.
func TestModelStatsFlushRetries(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	rec := s.NewModelStatsRecorder()
	now := time.Now()
	rec.SetClock(func() time.Time { return now })
	rec.Record("m", "", modelrouter.Outcome{LatencyMS: 5})
	now = now.Add(s.ModelStatsTTL()) // a new window: the first call's shard waits to be written
	rec.Record("m", "", modelrouter.Outcome{LatencyMS: 5, Failure: modelrouter.FailAuth})
	dead, cancel := context.WithCancel(ctx)
	cancel()
	if err := rec.Flush(dead); err == nil {
		t.Fatal("a flush on a cancelled context succeeded")
	}
	if all, err := s.ModelStats(ctx); err != nil || len(all) != 0 {
		t.Fatalf("written by a failed flush: %+v %v", all, err)
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	all, err := s.ModelStats(ctx)
	got := all[kvstore.ModelTask{Model: "m", TaskType: kvstore.TaskTypeNone}]
	if err != nil || got.Calls != 2 || got.Successes != 1 || got.Failures[modelrouter.FailAuth] != 1 {
		t.Fatalf("after the retry: %+v %v", got, err)
	}
}
