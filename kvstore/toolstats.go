package kvstore

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// BucketToolStats holds per-tool usage statistics, one key per tool and
// audit process (shard): <tool>.<shard>. Each shard key has one writer, so
// recording a call needs no compare-and-swap and no shared counter; readers
// merge the shards.
const BucketToolStats = subjects.BucketToolStats

// LatencyBoundsMS are the upper bounds of the latency histogram's buckets;
// a last bucket holds everything slower.
var LatencyBoundsMS = []int64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000, 300000}

// ToolShard is one audit process's totals for one tool.
type ToolShard struct {
	Calls     int64 `json:"calls"`
	Successes int64 `json:"successes"`
	LatencyMS int64 `json:"latency_ms"` // sum
	// Histogram counts calls by latency: Histogram[i] those at most
	// LatencyBoundsMS[i], the last one those slower than every bound.
	Histogram []int64   `json:"histogram"`
	Cost      float64   `json:"cost"`
	LastCall  time.Time `json:"last_call,omitzero"`
}

// Add counts one call.
func (s *ToolShard) Add(success bool, latencyMS int64, cost float64, at time.Time) {
	if len(s.Histogram) != len(LatencyBoundsMS)+1 {
		s.Histogram = slices.Grow(s.Histogram[:0], len(LatencyBoundsMS)+1)[:len(LatencyBoundsMS)+1]
	}
	s.Calls++
	if success {
		s.Successes++
	}
	s.LatencyMS += latencyMS
	i, _ := slices.BinarySearch(LatencyBoundsMS, latencyMS)
	s.Histogram[i]++
	s.Cost += cost
	if at.After(s.LastCall) {
		s.LastCall = at
	}
}

// Merge adds o's counts to s.
func (s *ToolShard) Merge(o ToolShard) {
	if len(s.Histogram) < len(o.Histogram) {
		s.Histogram = append(s.Histogram, make([]int64, len(o.Histogram)-len(s.Histogram))...)
	}
	for i, n := range o.Histogram {
		s.Histogram[i] += n
	}
	s.Calls += o.Calls
	s.Successes += o.Successes
	s.LatencyMS += o.LatencyMS
	s.Cost += o.Cost
	if o.LastCall.After(s.LastCall) {
		s.LastCall = o.LastCall
	}
}

// Percentile is the upper bound of the bucket holding the p-th percentile
// (0 < p ≤ 1) of latencies, in ms; 0 without calls.
func (s ToolShard) Percentile(p float64) float64 {
	if s.Calls == 0 {
		return 0
	}
	rank := int64(p*float64(s.Calls) + 0.999999)
	var seen int64
	for i, n := range s.Histogram {
		if seen += n; seen >= rank {
			if i < len(LatencyBoundsMS) {
				return float64(LatencyBoundsMS[i])
			}
			break
		}
	}
	return float64(LatencyBoundsMS[len(LatencyBoundsMS)-1])
}

// Summary is the public form of merged totals.
func (s ToolShard) Summary(id string) api.ToolStats {
	out := api.ToolStats{ToolID: id, Calls: s.Calls, Successes: s.Successes, Cost: s.Cost, LastCall: s.LastCall}
	if s.Calls > 0 {
		n := float64(s.Calls)
		out.SuccessRate = float64(s.Successes) / n
		out.MeanMS = float64(s.LatencyMS) / n
		out.AvgCost = s.Cost / n
		out.P50MS, out.P95MS, out.P99MS = s.Percentile(0.5), s.Percentile(0.95), s.Percentile(0.99)
	}
	return out
}

func statsKey(tool, shard string) string { return subjects.Token(tool) + "." + shard }

// ToolStats merges every shard's totals, by tool id.
func (s *Store) ToolStats(ctx context.Context) (map[string]ToolShard, error) {
	return mergeShards(ctx, s, s.toolstats, "tool statistics", parseStatsKey, decodeToolShard, (*ToolShard).Merge)
}

// parseStatsKey reads the tool id of a key made by statsKey.
func parseStatsKey(key string) (string, bool) {
	tok, _, ok := strings.Cut(key, ".")
	if !ok {
		return "", false
	}
	id, err := subjects.Untoken(tok)
	return id, err == nil
}

func decodeToolShard(data []byte) (ToolShard, error) {
	var sh ToolShard
	err := json.Unmarshal(data, &sh)
	return sh, err
}

// StatsRecorder keeps one process's share of the tool statistics: it adds
// calls in memory and writes its own shard keys, whole, with plain puts
// (shardRecorder, one shard for the process's life). Nothing is shared
// with other processes, so recording never waits on another writer. The
// writes of one process are coalesced: a call of a tool whose key was not
// written for StatsEvery writes at once (so the first call of a quiet tool
// is visible when its result is); calls recorded sooner, or while a write
// is under way, are written together once StatsEvery has passed, so a busy
// tool's key is written a few times a second, not once per call.
type StatsRecorder struct {
	*shardRecorder[string, ToolShard]
	armed bool // a delayed write is scheduled; under mu
}

// StatsEvery is the least time between two writes of a StatsRecorder's
// shard, but for Flush.
const StatsEvery = 250 * time.Millisecond

// NewStatsRecorder returns a recorder with a fresh shard.
func (s *Store) NewStatsRecorder() *StatsRecorder {
	return &StatsRecorder{shardRecorder: newShardRecorder[string, ToolShard](s.toolstats, "tool statistics", 0, statsKey)}
}

// Record counts one call of tool, and writes it at once unless its key was
// written less than StatsEvery ago or a write is under way: then a write
// StatsEvery after the last one takes it along. A failed write is retried
// with a later call or Flush.
func (r *StatsRecorder) Record(ctx context.Context, tool string, success bool, latencyMS int64, cost float64) error {
	now := time.Now()
	r.mu.Lock()
	r.add(tool, now, func(t *ToolShard) { t.Add(success, latencyMS, cost, now.UTC()) })
	if wait := StatsEvery - now.Sub(r.last[tool]); wait > 0 || !r.flushMu.TryLock() {
		if !r.armed {
			r.armed = true
			time.AfterFunc(max(wait, time.Millisecond), r.delayed)
		}
		r.mu.Unlock()
		return nil
	}
	r.mu.Unlock()
	defer r.flushMu.Unlock()
	return r.flush(ctx)
}

// delayed is the scheduled write.
func (r *StatsRecorder) delayed() {
	r.mu.Lock()
	r.armed = false
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.Flush(ctx) // what failed stays dirty for the next write
}
