package kvstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/modelrouter"
	"github.com/toolgate/toolgate/subjects"
)

// BucketModelStats holds the model router's performance statistics (seed
// 000 §2.8, UPDATE_MODEL_STATS), one key per model, task type and shard:
// <model>.<task type>.<shard>. A shard is one execute process's share for
// one time window; it has one writer, so recording needs no
// compare-and-swap and no shared counter, and readers merge the shards.
// The bucket's max age expires a shard that nobody writes any more (a
// window that ended, a process that died).
const BucketModelStats = subjects.BucketModelStats

// DefaultModelStatsTTL is the model statistics bucket's default max age.
const DefaultModelStatsTTL = time.Hour

// ModelStatsVersion is the version of ModelShard's encoding; a shard of
// another version is not merged.
const ModelStatsVersion = 1

// ModelLatencyBoundsMS are the upper bounds of a model shard's latency
// histogram buckets: 10 ms · 2^(i/4), 65 bounds up to about 11 minutes,
// each about 19% above the one before; a last bucket holds everything
// slower. Fixed bounds make histograms of different shards add up.
var ModelLatencyBoundsMS = func() []int64 {
	out := make([]int64, 65)
	for i := range out {
		out[i] = int64(math.Round(10 * math.Pow(2, float64(i)/4)))
	}
	return out
}()

// maxModelCount bounds every count and token total a decoded shard may
// hold, so that merging many shards cannot overflow.
const maxModelCount = 1 << 50

// ModelTask names one model and task type.
type ModelTask struct {
	Model    string
	TaskType string
}

// ModelShard is one shard's totals for one model and task type, or the
// merge of several.
type ModelShard struct {
	V         int   `json:"v"`
	Calls     int64 `json:"calls"`
	Successes int64 `json:"successes"`
	// Failures counts failed calls by class (modelrouter.FailureClasses).
	Failures     map[string]int64 `json:"failures,omitempty"`
	InputTokens  int64            `json:"input_tokens"`
	OutputTokens int64            `json:"output_tokens"`
	Cost         float64          `json:"cost"`
	LatencyMS    int64            `json:"latency_ms"` // sum
	// Histogram counts calls by latency: Histogram[i] those at most
	// ModelLatencyBoundsMS[i], the last one those slower than every bound.
	Histogram []int64   `json:"histogram"`
	LastCall  time.Time `json:"last_call,omitzero"`
}

// Add counts one call.
func (s *ModelShard) Add(o modelrouter.Outcome, at time.Time) {
	s.V = ModelStatsVersion
	if len(s.Histogram) != len(ModelLatencyBoundsMS)+1 {
		s.Histogram = make([]int64, len(ModelLatencyBoundsMS)+1)
	}
	s.Calls++
	if o.Failure == "" {
		s.Successes++
	} else {
		if s.Failures == nil {
			s.Failures = map[string]int64{}
		}
		s.Failures[o.Failure]++
	}
	s.InputTokens += max(o.InputTokens, 0)
	s.OutputTokens += max(o.OutputTokens, 0)
	s.Cost += max(o.Cost, 0)
	ms := max(o.LatencyMS, 0)
	s.LatencyMS += ms
	i, _ := slices.BinarySearch(ModelLatencyBoundsMS, ms)
	s.Histogram[i]++
	if at.After(s.LastCall) {
		s.LastCall = at
	}
}

// Merge adds o's counts to s.
func (s *ModelShard) Merge(o ModelShard) {
	s.V = ModelStatsVersion
	if len(s.Histogram) < len(o.Histogram) {
		s.Histogram = append(s.Histogram, make([]int64, len(o.Histogram)-len(s.Histogram))...)
	}
	for i, n := range o.Histogram {
		s.Histogram[i] += n
	}
	for k, n := range o.Failures {
		if s.Failures == nil {
			s.Failures = map[string]int64{}
		}
		s.Failures[k] += n
	}
	s.Calls += o.Calls
	s.Successes += o.Successes
	s.InputTokens += o.InputTokens
	s.OutputTokens += o.OutputTokens
	s.Cost += o.Cost
	s.LatencyMS += o.LatencyMS
	if o.LastCall.After(s.LastCall) {
		s.LastCall = o.LastCall
	}
}

// Percentile is the upper bound of the histogram bucket holding the p-th
// percentile (0 < p ≤ 1) of latencies, in ms; 0 without calls.
func (s ModelShard) Percentile(p float64) float64 {
	if s.Calls == 0 {
		return 0
	}
	rank := int64(math.Ceil(p * float64(s.Calls)))
	var seen int64
	for i, n := range s.Histogram {
		if seen += n; seen >= rank {
			if i < len(ModelLatencyBoundsMS) {
				return float64(ModelLatencyBoundsMS[i])
			}
			break
		}
	}
	return float64(ModelLatencyBoundsMS[len(ModelLatencyBoundsMS)-1])
}

// SuccessRate is the share of calls that succeeded; 0 without calls.
func (s ModelShard) SuccessRate() float64 {
	if s.Calls == 0 {
		return 0
	}
	return float64(s.Successes) / float64(s.Calls)
}

// Observed is what routing uses of s.
func (s ModelShard) Observed() modelrouter.Observed {
	return modelrouter.Observed{Calls: s.Calls, SuccessRate: s.SuccessRate(), P50MS: s.Percentile(0.5), P95MS: s.Percentile(0.95)}
}

// ErrBadModelShard marks a value of the model statistics bucket that is not
// a shard this version can merge.
var ErrBadModelShard = errors.New("not a model statistics shard")

// DecodeModelShard reads one value of the model statistics bucket and
// checks that it adds up: its version, a histogram of the right length
// whose counts sum to the calls, successes and failures that sum to the
// calls, known failure classes, and no negative or outsized number.
func DecodeModelShard(data []byte) (ModelShard, error) {
	var s ModelShard
	if err := json.Unmarshal(data, &s); err != nil {
		return ModelShard{}, fmt.Errorf("%w: %v", ErrBadModelShard, err)
	}
	bad := func(format string, args ...any) (ModelShard, error) {
		return ModelShard{}, fmt.Errorf("%w: %s", ErrBadModelShard, fmt.Sprintf(format, args...))
	}
	if s.V != ModelStatsVersion {
		return bad("version %d, want %d", s.V, ModelStatsVersion)
	}
	if len(s.Histogram) != len(ModelLatencyBoundsMS)+1 {
		return bad("histogram of %d buckets, want %d", len(s.Histogram), len(ModelLatencyBoundsMS)+1)
	}
	inRange := func(n int64) bool { return n >= 0 && n <= maxModelCount }
	if !inRange(s.Calls) || !inRange(s.Successes) || !inRange(s.InputTokens) || !inRange(s.OutputTokens) || !inRange(s.LatencyMS) {
		return bad("a count is negative or over %d", int64(maxModelCount))
	}
	if s.Cost < 0 || s.Cost > maxModelCount || math.IsNaN(s.Cost) {
		return bad("cost %v", s.Cost)
	}
	var inHist int64
	for _, n := range s.Histogram {
		if !inRange(n) {
			return bad("a histogram count is negative or over %d", int64(maxModelCount))
		}
		inHist += n
	}
	failed := int64(0)
	for k, n := range s.Failures {
		if !slices.Contains(modelrouter.FailureClasses, k) || !inRange(n) {
			return bad("failure class %q: %d", k, n)
		}
		failed += n
	}
	if inHist != s.Calls || s.Successes+failed != s.Calls {
		return bad("%d calls, %d in the histogram, %d successes and %d failures", s.Calls, inHist, s.Successes, failed)
	}
	return s, nil
}

// TaskTypeNone is the task type of calls that name none.
const TaskTypeNone = "none"

func modelStatsKey(mt ModelTask, shard string) string {
	return subjects.Token(mt.Model) + "." + subjects.Token(cmpOr(mt.TaskType, TaskTypeNone)) + "." + shard
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// parseModelStatsKey reads a key made by modelStatsKey.
func parseModelStatsKey(key string) (ModelTask, bool) {
	parts := strings.Split(key, ".")
	if len(parts) != 3 {
		return ModelTask{}, false
	}
	m, err1 := subjects.Untoken(parts[0])
	tt, err2 := subjects.Untoken(parts[1])
	if err1 != nil || err2 != nil || m == "" || tt == "" {
		return ModelTask{}, false
	}
	return ModelTask{Model: m, TaskType: tt}, true
}

// ModelStatsTTL is the model statistics bucket's max age: how long a shard
// counts after its last write.
func (s *Store) ModelStatsTTL() time.Duration { return s.modelStatsTTL }

// ModelStats merges every live shard's totals, by model and task type:
// what every execute process of the cluster saw within the bucket's max
// age.
func (s *Store) ModelStats(ctx context.Context) (map[ModelTask]ModelShard, error) {
	return mergeShards(ctx, s, s.modelstats, "model statistics", parseModelStatsKey, DecodeModelShard, (*ModelShard).Merge)
}

// ModelStatsRecorder keeps one execute process's share of the model
// statistics. Record only adds in memory; Run writes the changed totals
// of this process's own shard keys every interval, whole, with plain puts
// (shardRecorder), so a model call never waits on the bucket. A shard
// covers one window of a third of the bucket's max age; then the recorder
// starts a new one and the old one expires, so the merged statistics are
// those of the last 1 to 1⅓ max ages.
type ModelStatsRecorder struct {
	*shardRecorder[ModelTask, ModelShard]
}

// NewModelStatsRecorder returns a recorder with fresh shards.
func (s *Store) NewModelStatsRecorder() *ModelStatsRecorder {
	return &ModelStatsRecorder{newShardRecorder[ModelTask, ModelShard](s.modelstats, "model statistics",
		max(s.modelStatsTTL/3, time.Second), modelStatsKey)}
}

// Record counts one call of model for a task type. It never blocks on the
// bus.
func (r *ModelStatsRecorder) Record(model, taskType string, o modelrouter.Outcome) {
	now := r.now()
	mt := ModelTask{Model: model, TaskType: cmpOr(taskType, TaskTypeNone)}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.add(mt, now, func(t *ModelShard) { t.Add(o, now.UTC()) })
}

// Run flushes every interval until ctx ends, then once more (on a context
// of its own, bounded by five seconds) so that the last calls count. It
// reports failed flushes to onErr, when set.
func (r *ModelStatsRecorder) Run(ctx context.Context, every time.Duration, onErr func(error)) {
	t := time.NewTicker(every)
	defer t.Stop()
	report := func(err error) {
		if err != nil && onErr != nil {
			onErr(err)
		}
	}
	for {
		select {
		case <-t.C:
			report(r.Flush(ctx))
		case <-ctx.Done():
			last, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			report(r.Flush(last))
			cancel()
			return
		}
	}
}

// ModelStatsView holds the merged model statistics in memory, kept in
// step with the bucket by a watch, for routing: reading it never touches
// the bus. A shard older than the bucket's max age is left out even before
// the server removes it.
type ModelStatsView struct {
	ttl time.Duration

	mu      sync.Mutex
	shards  map[string]viewShard
	dirty   bool
	at      time.Time // when merged was computed
	byTask  map[ModelTask]ModelShard
	byModel map[string]ModelShard
}

type viewShard struct {
	mt      ModelTask
	shard   ModelShard
	written time.Time
}

// viewRefresh is how often a view recomputes its merge to drop expired
// shards when nothing changed.
const viewRefresh = 10 * time.Second

// WatchModelStats returns a view of the model statistics that follows the
// bucket until ctx ends; it returns once the stored shards are loaded.
func (s *Store) WatchModelStats(ctx context.Context) (*ModelStatsView, error) {
	v := &ModelStatsView{ttl: s.modelStatsTTL, shards: map[string]viewShard{}, dirty: true}
	err := s.watch(ctx, s.modelstats, func(e jetstream.KeyValueEntry) {
		v.mu.Lock()
		defer v.mu.Unlock()
		v.dirty = true
		mt, ok := parseModelStatsKey(e.Key())
		if e.Operation() != jetstream.KeyValuePut || !ok {
			delete(v.shards, e.Key())
			return
		}
		sh, err := DecodeModelShard(e.Value())
		if err != nil {
			delete(v.shards, e.Key())
			return
		}
		v.shards[e.Key()] = viewShard{mt: mt, shard: sh, written: e.Created()}
	})
	if err != nil {
		return nil, err
	}
	return v, nil
}

// merged recomputes the merge when needed; the caller holds mu.
func (v *ModelStatsView) merged(now time.Time) {
	if !v.dirty && now.Sub(v.at) < viewRefresh {
		return
	}
	v.byTask, v.byModel = map[ModelTask]ModelShard{}, map[string]ModelShard{}
	for key, sh := range v.shards {
		if v.ttl > 0 && now.Sub(sh.written) > v.ttl {
			delete(v.shards, key)
			continue
		}
		t := v.byTask[sh.mt]
		t.Merge(sh.shard)
		v.byTask[sh.mt] = t
		m := v.byModel[sh.mt.Model]
		m.Merge(sh.shard)
		v.byModel[sh.mt.Model] = m
	}
	v.dirty, v.at = false, now
}

// Observer returns what routing a call of taskType may know of each
// model: the model's statistics for that task type when they hold
// modelrouter.MinObservedCalls calls, else its statistics over every task
// type. The returned function reads a snapshot and is safe for concurrent
// use.
func (v *ModelStatsView) Observer(taskType string) func(model string) (modelrouter.Observed, bool) {
	if v == nil {
		return nil
	}
	v.mu.Lock()
	v.merged(time.Now())
	byTask, byModel := v.byTask, v.byModel
	v.mu.Unlock()
	tt := cmpOr(taskType, TaskTypeNone)
	return func(model string) (modelrouter.Observed, bool) {
		if s, ok := byTask[ModelTask{Model: model, TaskType: tt}]; ok && s.Calls >= modelrouter.MinObservedCalls {
			return s.Observed(), true
		}
		s, ok := byModel[model]
		if !ok {
			return modelrouter.Observed{}, false
		}
		return s.Observed(), true
	}
}

// Summary is the public form of merged totals.
func (s ModelShard) Summary(mt ModelTask) api.ModelStats {
	out := api.ModelStats{Model: mt.Model, TaskType: mt.TaskType, Calls: s.Calls, Successes: s.Successes,
		InputTokens: s.InputTokens, OutputTokens: s.OutputTokens, Cost: s.Cost, LastCall: s.LastCall}
	if len(s.Failures) > 0 {
		out.Failures = maps.Clone(s.Failures)
	}
	if s.Calls > 0 {
		n := float64(s.Calls)
		out.SuccessRate = s.SuccessRate()
		out.MeanMS = float64(s.LatencyMS) / n
		out.AvgCost = s.Cost / n
		out.P50MS, out.P95MS, out.P99MS = s.Percentile(0.5), s.Percentile(0.95), s.Percentile(0.99)
	}
	return out
}
