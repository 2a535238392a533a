package bench

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// TestProfileShares: each sample counts once in every share whose code is
// on its stack, however often that code recurs, and the shares are per
// call.
func TestProfileShares(t *testing.T) {
	const run = "github.com/toolgate/toolgate/internal/runner.(*Runner).Run.func3"
	b := cpuProfile(t, []stackSample{
		{40, []string{"crypto/internal/fips140/ed25519.Sign", "crypto/ed25519.Sign", "github.com/toolgate/toolgate/internal/seal.(*Signer).Sign", run}},
		{30, []string{"encoding/json.checkValid", "encoding/json.Valid", "encoding/json.Unmarshal", run}},
		{20, []string{"github.com/toolgate/toolgate/stages/authorize.(*Authorizer).Process", run, run}},
		{100, []string{"internal/runtime/syscall/linux.Syscall6", "github.com/nats-io/nats-server/v2/server.(*msgBlock).writeMsgRecord"}},
		{10, []string{"runtime.gcBgMarkWorker"}},
		// A goroutine the runner started to settle a message.
		{15, []string{"runtime.selectgo", "github.com/toolgate/toolgate/internal/runner.(*Runner).apply.func4", "sync.(*WaitGroup).Go.func1"}},
	})
	got, err := profileShares(b, 10)
	if err != nil {
		t.Fatal(err)
	}
	ms := func(n int64) time.Duration { return time.Duration(n) * time.Millisecond / 10 }
	want := ProfileShares{Total: ms(215), Stages: ms(105), Sign: ms(40), JSON: ms(30), Server: ms(100)}
	if got != want {
		t.Fatalf("shares %+v, want %+v", got, want)
	}
	if _, err := profileShares([]byte("not a profile"), 10); err == nil {
		t.Fatal("a file that is no profile was read")
	}
}

// TestPrintFloorProfile: the floor chain's profile is printed whether or
// not toolgate's was read, and the difference only beside toolgate's.
func TestPrintFloorProfile(t *testing.T) {
	for _, toolgateErr := range []error{nil, errors.New("pprof: 500")} {
		s := &Shipped{Profile: "serve.prof", ProfileSeconds: 20, profileErr: toolgateErr,
			Shares:       ProfileShares{Server: 2500 * time.Microsecond},
			FloorProfile: "serve-floor.prof", FloorProfileCalls: 3000,
			FloorShares: ProfileShares{Total: 3000 * time.Microsecond, Server: 2900 * time.Microsecond}}
		var b strings.Builder
		s.Print(&b)
		out := b.String()
		if !strings.Contains(out, "floor chain's CPU profile (20 s in two windows, 3000 calls at saturation): serve-floor.prof") {
			t.Errorf("no floor profile printed:\n%s", out)
		}
		if diff := strings.Contains(out, "toolgate's less this"); diff != (toolgateErr == nil) {
			t.Errorf("difference printed %v with toolgate's profile error %v:\n%s", diff, toolgateErr, out)
		}
	}
}

// stackSample is a CPU profile's sample: its milliseconds and its stack,
// innermost function first.
type stackSample struct {
	ms    int64
	stack []string
}

// cpuProfile is a CPU profile, in pprof's format, of samples.
func cpuProfile(t *testing.T, samples []stackSample) []byte {
	t.Helper()
	fns := map[string]*profile.Function{}
	var locs uint64
	loc := func(names ...string) []*profile.Location {
		var out []*profile.Location
		for _, n := range names {
			f, ok := fns[n]
			if !ok {
				f = &profile.Function{ID: uint64(len(fns) + 1), Name: n}
				fns[n] = f
			}
			locs++
			out = append(out, &profile.Location{ID: locs, Line: []profile.Line{{Function: f}}})
		}
		return out
	}
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"}, Period: int64(10 * time.Millisecond),
	}
	for _, s := range samples {
		p.Sample = append(p.Sample, &profile.Sample{Value: []int64{s.ms / 10, s.ms * int64(time.Millisecond)}, Location: loc(s.stack...)})
	}
	for _, f := range fns {
		p.Function = append(p.Function, f)
	}
	for _, s := range p.Sample {
		p.Location = append(p.Location, s.Location...)
	}
	var b bytes.Buffer
	if err := p.Write(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestSeriesMergesItsWindows: a series profiled in two windows reads as
// one profile of both: its shares are the windows' samples over the calls
// of both, and the merged profile is what it writes.
func TestSeriesMergesItsWindows(t *testing.T) {
	const server = "github.com/nats-io/nats-server/v2/server.(*msgBlock).writeMsgRecord"
	const stage = "github.com/toolgate/toolgate/internal/runner.(*Runner).Run.func3"
	first := cpuProfile(t, []stackSample{{100, []string{server}}, {50, []string{stage}}})
	second := cpuProfile(t, []stackSample{{300, []string{server}}, {150, []string{"runtime.gcBgMarkWorker"}}, {20, []string{stage}}})
	path := filepath.Join(t.TempDir(), "serve.prof")
	ps := &profileSeries{path: path, parts: [][]byte{first, second}, calls: 10, cpu: 700 * time.Millisecond}
	calls, got, err := ps.shares()
	if err != nil {
		t.Fatal(err)
	}
	ms := func(n int64) time.Duration { return time.Duration(n) * time.Millisecond / 10 }
	want := ProfileShares{Total: ms(620), Stages: ms(70), Server: ms(400), Kernel: ms(700)}
	if calls != 10 || got != want {
		t.Fatalf("%d calls, shares %+v; want 10, %+v", calls, got, want)
	}
	written, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	again, err := profileShares(written, 10)
	if err != nil {
		t.Fatal(err)
	}
	if again.Total != want.Total || again.Server != want.Server {
		t.Fatalf("the profile written reads %+v, want the merged %+v", again, want)
	}

	failed := &profileSeries{path: path, parts: [][]byte{first}, err: errors.New("pprof: 500")}
	if _, _, err := failed.shares(); err == nil {
		t.Fatal("a series with a failed window read as whole")
	}
	if _, err := mergeProfiles(nil); err == nil {
		t.Fatal("no windows merged into a profile")
	}
}

// TestInTurns: every series takes two windows, and each series' windows
// centre on the same moment, so a steady drift favours none.
func TestInTurns(t *testing.T) {
	for _, n := range []int{2, 4} {
		order := inTurns(n)
		if len(order) != 2*n {
			t.Fatalf("%d series: %d windows, want %d", n, len(order), 2*n)
		}
		sum := make([]int, n)
		count := make([]int, n)
		for at, k := range order {
			sum[k] += at
			count[k]++
		}
		for k := range n {
			if count[k] != 2 || sum[k] != 2*n-1 {
				t.Errorf("%d series: series %d at %d windows, positions summing to %d; want 2, %d (order %v)",
					n, k, count[k], sum[k], 2*n-1, order)
			}
		}
	}
}

var allocSink [][]byte

//go:noinline
func allocateBefore() { allocSink = append(allocSink, make([]byte, 8<<20)) }

//go:noinline
func allocateBetween() {
	for range 2 {
		allocSink = append(allocSink, make([]byte, 8<<20))
	}
}

// allocsNow is this process's allocs profile as pprof's endpoint serves
// it, the last collection's.
func allocsNow(t *testing.T) []byte {
	t.Helper()
	runtime.GC()
	var b bytes.Buffer
	if err := pprof.Lookup("allocs").WriteTo(&b, 0); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestProfileDelta: the allocations between two allocs profiles of one
// process are those made between them, not those made before.
func TestProfileDelta(t *testing.T) {
	allocateBefore()
	before := allocsNow(t)
	allocateBetween()
	after := allocsNow(t)
	d, err := profileDelta(before, after)
	if err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(bytes.NewReader(d))
	if err != nil {
		t.Fatal(err)
	}
	space := -1
	for i, st := range p.SampleType {
		if st.Type == "alloc_space" {
			space = i
		}
	}
	if space < 0 {
		t.Fatalf("no alloc_space in the delta's sample types %v", p.SampleType)
	}
	by := map[string]int64{}
	for _, smp := range p.Sample {
		seen := map[string]bool{}
		for _, loc := range smp.Location {
			for _, l := range loc.Line {
				if n := l.Function.Name; strings.HasSuffix(n, ".allocateBefore") || strings.HasSuffix(n, ".allocateBetween") {
					if !seen[n] {
						seen[n] = true
						by[n[strings.LastIndex(n, ".")+1:]] += smp.Value[space]
					}
				}
			}
		}
	}
	// Allocations this large are always sampled.
	if got := by["allocateBetween"]; got < 15<<20 || got > 17<<20 {
		t.Errorf("allocations made between the profiles: %d bytes, want about %d", got, 16<<20)
	}
	if got := by["allocateBefore"]; got != 0 {
		t.Errorf("allocations made before both profiles count %d bytes in their delta, want 0", got)
	}
	if _, err := profileDelta(before, []byte("not a profile")); err == nil {
		t.Error("a delta against something not a profile read as one")
	}
}
