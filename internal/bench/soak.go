package bench

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/topology"
)

// soakSamples is how many times a soak run reads the resident set, the
// live heap and what the streams retain.
const soakSamples = 20

// soakGrowthGoal is the most the live heap may grow from the second quarter
// of a soak run (warm: caches, buffers, pools and the retained set filled)
// to the last.
const soakGrowthGoal = 0.10

// soakReadEvery is how often the soak reads the live heap and the resident
// set for their peaks per quarter; a read costs microseconds.
const soakReadEvery = 250 * time.Millisecond

// SoakRetention is how long the soak's pipeline keeps results, status
// records and audit events, as a fraction of the soak: a deployment that
// runs for long keeps them for a bounded time (and exports audit events),
// so what it retains stops growing once that time has passed. The soak
// holds the heap to that steady state, reached well inside its first
// quarter; with the defaults (results a day, status records a week, audit
// events 90 days) a soak of minutes would measure nothing but retention.
func SoakRetention(soak time.Duration) time.Duration { return max(soak/10, time.Second) }

// soakDuplicates is the soak pipeline's duplicate window (at most its
// retention): the default AckWait, so a hand-off published again after a
// redelivery is still recognised. The server keeps every message id of the
// window in memory, and its list of them until it is three times as long
// as the window's: with the default two minutes, at half saturation, that
// swings the heap by a hundred MiB every four minutes.
const soakDuplicates = topology.DefaultAckWait

// SoakTopology is the retention the soak's pipeline runs with.
func SoakTopology(soak time.Duration) topology.TopologyOptions {
	r := SoakRetention(soak)
	return topology.TopologyOptions{ResultTTL: r, AuditMaxAge: r, InvocationTTL: r, Duplicates: min(soakDuplicates, r)}
}

// SoakSample is one reading during a soak.
type SoakSample struct {
	RSS        float64 // MiB, the process's resident set
	Heap       float64 // MiB, the Go heap live at the last collection
	Goroutines int
	// Messages and Subjects are what all streams (buckets included) hold:
	// the retained set, beside which the heap's course is read.
	Messages, Subjects uint64
}

// Soak is a long run at a steady rate: its latency series, the readings at
// even intervals, and the peaks of the live heap and resident set in each
// quarter of the run.
type Soak struct {
	Rate      int
	Retention time.Duration // results, status records and audit events
	Result    Result
	Samples   []SoakSample // soakSamples of them, in order
	PeakHeap  [4]float64   // MiB, per quarter
	PeakRSS   [4]float64   // MiB, per quarter
}

// Growth is the live heap's growth from the second quarter's peak to the
// last quarter's, as a fraction. Peaks over a quarter, read four times a
// second, take in the whole swing of anything that rises and falls
// within a quarter (collections, the server's duplicate window), so what
// remains is growth.
func (s Soak) Growth() float64 { return growth(s.PeakHeap) }

// RSSGrowth is Growth for the resident set. It is not held: the Go runtime
// returns freed memory to the system lazily, so the resident set follows the
// heap's peaks, not its level.
func (s Soak) RSSGrowth() float64 { return growth(s.PeakRSS) }

func growth(p [4]float64) float64 {
	if p[1] <= 0 {
		return 0
	}
	return (p[3] - p[1]) / p[1]
}

// retainedSet sums the messages and subjects that all streams hold.
func retainedSet(ctx context.Context, js jetstream.JetStream) (msgs, subjects uint64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l := js.ListStreams(ctx)
	for info := range l.Info() {
		msgs += info.State.Msgs
		subjects += info.State.NumSubjects
	}
	return msgs, subjects, l.Err()
}

// heapLiveMiB is the Go heap marked live by the last collection.
func heapLiveMiB() float64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return float64(s[0].Value.Uint64()) / (1 << 20)
}

// soak offers rate/s to t for d and reads the resident set, the live heap
// and the retained set (through js) soakSamples times on the way. It keeps
// one latency per call and no map, so that the load generator, which shares
// the process, does not grow with the run.
func (t *target) soak(ctx context.Context, js jetstream.JetStream, rate int, d time.Duration) (Soak, error) {
	s := Soak{Rate: rate}
	n := int(float64(rate) * d.Seconds())
	interval := time.Second / time.Duration(rate)
	prefix := fmt.Sprintf("soak-%d-", time.Now().UnixNano())
	start := time.Now()
	var mu sync.Mutex
	lat := make([]time.Duration, 0, n)
	t.cur.Store(&collector{sink: func(key string, at time.Time) {
		i, err := strconv.Atoi(strings.TrimPrefix(key, prefix))
		if err != nil || !strings.HasPrefix(key, prefix) {
			return
		}
		mu.Lock()
		lat = append(lat, at.Sub(start.Add(time.Duration(i)*interval)))
		mu.Unlock()
	}})
	defer t.cur.Store(nil)

	// The peaks are read beside the publisher, until it is done.
	var peakHeap, peakRSS [4]float64
	var peaks sync.WaitGroup
	peaksCtx, stopPeaks := context.WithCancel(ctx)
	peaks.Go(func() {
		tick := time.NewTicker(soakReadEvery)
		defer tick.Stop()
		for {
			q := min(int(4*time.Since(start)/max(d, 1)), 3)
			h, r := heapLiveMiB(), rssMiB()
			peakHeap[q] = max(peakHeap[q], h)
			peakRSS[q] = max(peakRSS[q], r)
			select {
			case <-peaksCtx.Done():
				return
			case <-tick.C:
			}
		}
	})
	defer func() { stopPeaks(); peaks.Wait() }()

	every := max(n/soakSamples, 1)
	for i := range n {
		if w := time.Until(start.Add(time.Duration(i) * interval)); w > 0 {
			time.Sleep(w)
		}
		if err := t.publish(ctx, prefix+strconv.Itoa(i), i); err != nil {
			return s, err
		}
		if (i+1)%every == 0 && len(s.Samples) < soakSamples {
			msgs, subs, err := retainedSet(ctx, js)
			if err != nil {
				return s, fmt.Errorf("reading the retained set: %w", err)
			}
			s.Samples = append(s.Samples, SoakSample{RSS: rssMiB(), Heap: heapLiveMiB(),
				Goroutines: runtime.NumGoroutine(), Messages: msgs, Subjects: subs})
		}
	}
	stopPeaks()
	peaks.Wait()
	s.PeakHeap, s.PeakRSS = peakHeap, peakRSS
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		got := len(lat)
		mu.Unlock()
		if got >= n {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	s.Result = Result{Name: "toolgate soak", Sent: n, Done: len(lat), Elapsed: time.Since(start), Latencies: slices.Clone(lat)}
	slices.Sort(s.Result.Latencies)
	return s, nil
}

// Print writes the soak's figures: the course of the resident set, the live
// heap and the retained set, and the heap's growth against the goal.
func (s Soak) Print(w io.Writer) {
	fmt.Fprintf(w, "\nsoak: %d/s (half of saturation) for %v, %d of %d done, p50 %s, p99 %s\n",
		s.Rate, s.Result.Elapsed.Round(time.Second), s.Result.Done, s.Result.Sent, ms(s.Result.Quantile(0.5)), ms(s.Result.Quantile(0.99)))
	if s.Retention > 0 {
		fmt.Fprintf(w, "results, status records and audit events kept %v, duplicate window %v\n", s.Retention, min(soakDuplicates, s.Retention))
	}
	row := func(name string, f func(SoakSample) string) {
		var b strings.Builder
		for i, x := range s.Samples {
			if i > 0 {
				b.WriteString(" ")
			}
			b.WriteString(f(x))
		}
		fmt.Fprintf(w, "%-28s %s\n", name, b.String())
	}
	fmt.Fprintf(w, "every %d%% of the run:\n", 100/soakSamples)
	row("RSS MiB", func(x SoakSample) string { return fmt.Sprintf("%.0f", x.RSS) })
	row("live heap MiB", func(x SoakSample) string { return fmt.Sprintf("%.0f", x.Heap) })
	row("retained messages, 1000s", func(x SoakSample) string { return fmt.Sprintf("%.0f", float64(x.Messages)/1000) })
	row("retained subjects, 1000s", func(x SoakSample) string { return fmt.Sprintf("%.0f", float64(x.Subjects)/1000) })
	row("goroutines", func(x SoakSample) string { return strconv.Itoa(x.Goroutines) })
	peaks := func(p [4]float64) string {
		return fmt.Sprintf("%.0f %.0f %.0f %.0f", p[0], p[1], p[2], p[3])
	}
	fmt.Fprintf(w, "%-28s %s\n", "peak per quarter, RSS MiB", peaks(s.PeakRSS))
	fmt.Fprintf(w, "%-28s %s\n", "peak per quarter, heap MiB", peaks(s.PeakHeap))
	g := s.Growth()
	v := "met"
	if g > soakGrowthGoal {
		v = "NOT MET"
	}
	fmt.Fprintf(w, "%-40s %+11.1f%% %8s  %s\n", "live heap growth, 2nd to 4th quarter", 100*g, fmt.Sprintf("<=%.0f%%", 100*soakGrowthGoal), v)
	fmt.Fprintf(w, "%-40s %+11.1f%%\n", "RSS growth, 2nd to 4th quarter", 100*s.RSSGrowth())
}
