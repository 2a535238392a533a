package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// soakSamples is how many times a soak run reads the resident set.
const soakSamples = 20

// soakGrowthGoal is the most the resident set may grow from the end of the
// first quarter of a soak run (warm: caches, buffers and pools filled) to
// its end.
const soakGrowthGoal = 0.10

// Soak is a long run at a steady rate: its latency series and the resident
// set read at even intervals.
type Soak struct {
	Rate   int
	Result Result
	RSS    []float64 // MiB, soakSamples of them, in order
}

// Growth is the resident set's growth from the end of the first quarter to
// the end, as a fraction.
func (s Soak) Growth() float64 {
	if len(s.RSS) < 4 {
		return 0
	}
	warm := s.RSS[len(s.RSS)/4-1]
	return (s.RSS[len(s.RSS)-1] - warm) / max(warm, 1e-9)
}

// soak offers rate/s to t for d and reads the resident set soakSamples
// times on the way. It keeps one latency per call and no map, so that the
// load generator, which shares the process, does not grow with the run.
func (t *target) soak(ctx context.Context, rate int, d time.Duration) (Soak, error) {
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
	every := max(n/soakSamples, 1)
	for i := range n {
		if w := time.Until(start.Add(time.Duration(i) * interval)); w > 0 {
			time.Sleep(w)
		}
		if err := t.publish(ctx, prefix+strconv.Itoa(i), i); err != nil {
			return s, err
		}
		if (i+1)%every == 0 && len(s.RSS) < soakSamples {
			s.RSS = append(s.RSS, rssMiB())
		}
	}
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

// Print writes the soak's figures and the resident set's course.
func (s Soak) Print(w io.Writer) {
	fmt.Fprintf(w, "\nsoak: %d/s (half of saturation) for %v, %d of %d done, p50 %s, p99 %s\n",
		s.Rate, s.Result.Elapsed.Round(time.Second), s.Result.Done, s.Result.Sent, ms(s.Result.Quantile(0.5)), ms(s.Result.Quantile(0.99)))
	var b strings.Builder
	for i, r := range s.RSS {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%.0f", r)
	}
	fmt.Fprintf(w, "RSS MiB every %d%% of the run: %s\n", 100/soakSamples, b.String())
	g := s.Growth()
	v := "met"
	if g > soakGrowthGoal {
		v = "NOT MET"
	}
	fmt.Fprintf(w, "%-40s %+11.1f%% %8s  %s\n", "RSS growth after the first quarter", 100*g, fmt.Sprintf("<=%.0f%%", 100*soakGrowthGoal), v)
}
