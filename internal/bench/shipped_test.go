package bench

import (
	"context"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/cputime"
)

// TestProcCPU reads this process's CPU time from /proc as the shipped
// series reads serve's, and checks it against the kernel's own account.
func TestProcCPU(t *testing.T) {
	before, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	r0 := cputime.Process()
	// Spin until the kernel has counted 300 ms of CPU, however long that
	// takes on a busy machine.
	x := 0
	for cputime.Process()-r0 < 300*time.Millisecond {
		for range 100000 {
			x++
		}
	}
	after, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	got, want := after-before, cputime.Process()-r0
	if got < 100*time.Millisecond || got > want+50*time.Millisecond || got < want-50*time.Millisecond {
		t.Fatalf("procCPU grew %v over a busy loop, getrusage %v (x=%d)", got, want, x)
	}
}

// TestShipped runs the shipped series briefly against a real `toolgate
// serve` process: every call offered by the agent connection completes,
// serve's CPU is counted, and the stages of that one process make no
// key-value read for a call of the no-op tool (their stores share what
// they wrote).
func TestShipped(t *testing.T) {
	if testing.Short() {
		t.Skip("starts toolgate serve")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// The same build stands in for the baseline: its rounds are measured
	// in turn with the others on a serve of its own.
	bin := buildToolgate(t)
	s, err := measureShipped(ctx, bin, t.TempDir(), 50, time.Second, "", bin, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []Result{s.Toolgate, s.Floor, s.Raw, s.Unloaded, s.UnloadedFloor, s.Half} {
		if r.Sent == 0 || r.Done != r.Sent {
			t.Errorf("%s: %d of %d calls completed", r.Name, r.Done, r.Sent)
		}
	}
	// As shipped fewer rounds; with --sync interval, where the builds are
	// compared, the baseline's in turn with this build's.
	if len(s.Rounds) != ratesRounds || len(s.CPURounds) != shippedRounds || len(s.Baseline) != shippedRounds || s.CPUSync != "interval" {
		t.Errorf("%d saturation rounds as shipped, want %d; %d with --sync %q and %d of the baseline, want %d each with interval",
			len(s.Rounds), ratesRounds, len(s.CPURounds), s.CPUSync, len(s.Baseline), shippedRounds)
	}
	// Both modes, each with every chain's writes counted: the floor makes
	// the pipeline's twelve stores a call, plus a tombstone for each of
	// the six hand-offs acknowledged, all to file streams; the bare chain
	// six stores and six tombstones; toolgate writes. With --sync always
	// each record is fsynced.
	if len(s.Modes) != 2 || s.Modes[0].Sync != "always" || s.Modes[1].Sync != "interval" {
		t.Fatalf("modes %+v, want always and interval", s.Modes)
	}
	for _, m := range s.Modes {
		for _, c := range []struct {
			name         string
			w            writesPerCall
			stores, dels float64
		}{{"floor", m.FloorWrites, 12, 6}, {"bare", m.RawWrites, 7, 6}} {
			if math.Abs(c.w.File-c.w.Deletes-c.stores) > 0.5 || math.Abs(c.w.Deletes-c.dels) > 0.5 || c.w.Memory != 0 {
				t.Errorf("--sync %s, %s: %.2f file writes of which %.2f deletes, %.2f memory; want %.0f stores and %.0f deletes",
					m.Sync, c.name, c.w.File, c.w.Deletes, c.w.Memory, c.stores, c.dels)
			}
		}
		if tw := m.ToolgateWrites; tw.File+tw.Memory < 1 || len(tw.Streams) == 0 {
			t.Errorf("--sync %s: toolgate's writes per call not counted: %+v", m.Sync, tw)
		}
		for _, w := range []writesPerCall{m.ToolgateWrites, m.FloorWrites, m.RawWrites} {
			if !w.FsyncsCounted {
				continue // no perf here
			}
			if m.Sync == "always" && w.Fsyncs < 0.9*w.File {
				t.Errorf("--sync always: %.2f fsyncs per call for %.2f file records", w.Fsyncs, w.File)
			}
			if m.Sync == "interval" && w.Fsyncs > 0.5 {
				t.Errorf("--sync interval: %.2f fsyncs per call", w.Fsyncs)
			}
		}
		if m.Unloaded.Done == 0 || m.Unloaded.Done != m.Unloaded.Sent || m.UnloadedRaw.Done != m.UnloadedRaw.Sent {
			t.Errorf("--sync %s: unloaded calls %d of %d, bare %d of %d", m.Sync, m.Unloaded.Done, m.Unloaded.Sent, m.UnloadedRaw.Done, m.UnloadedRaw.Sent)
		}
	}
	for i, r := range append(s.Baseline, s.CPURounds...) {
		if r.Toolgate.Done != r.Toolgate.Sent || r.ToolgateServeCPU <= 0 || r.FloorServeCPU <= 0 {
			t.Errorf("baseline round %d: %d of %d calls, serve CPU %v, floor's %v", i, r.Toolgate.Done, r.Toolgate.Sent, r.ToolgateServeCPU, r.FloorServeCPU)
		}
	}
	if s.ToolgateServeCPU <= 0 || s.FloorServeCPU <= 0 {
		t.Errorf("serve's CPU per call not counted: toolgate %v, floor %v", s.ToolgateServeCPU, s.FloorServeCPU)
	}
	if s.startGC <= 0 {
		t.Errorf("serve's metrics give its collector no CPU (go_cpu_classes_gc_total_cpu_seconds_total): the bench cannot show its share")
	}
	// Toolgate's calls allocate in serve where the floor's (the server's
	// work only) allocate less: both counted.
	if s.FloorAllocs.objects <= 0 || s.ToolgateAllocs.objects <= s.FloorAllocs.objects || s.ToolgateAllocs.bytes <= 0 {
		t.Errorf("serve's heap allocations per call: toolgate %+v, floor %+v", s.ToolgateAllocs, s.FloorAllocs)
	}
	// Execute reads each call's status record before it runs the no-op
	// tool (idempotent and quick, so not claimed first); the other
	// buckets' writes need no read of what this process wrote.
	if s.ReadsPerCall < 0.9 || s.ReadsPerCall > 2 {
		t.Errorf("%.2f key-value reads per call, want execute's one", s.ReadsPerCall)
	}
	s.Print(os.Stdout)
}

// TestMedianRound: the saturation figures come from the round of median
// own CPU, not the first or the last.
func TestMedianRound(t *testing.T) {
	round := func(serve time.Duration) ShippedRound {
		return ShippedRound{Toolgate: Result{Name: serve.String()}, ToolgateServeCPU: serve, FloorServeCPU: 100 * time.Microsecond}
	}
	s := Shipped{Rounds: []ShippedRound{round(900 * time.Microsecond), round(300 * time.Microsecond), round(500 * time.Microsecond)}}
	s.useMedianRound()
	if s.ToolgateServeCPU != 500*time.Microsecond || s.OwnCPU() != 400*time.Microsecond || s.Toolgate.Name != "500µs" {
		t.Errorf("median round: serve %v, own %v, series %q; want 500µs, 400µs, 500µs", s.ToolgateServeCPU, s.OwnCPU(), s.Toolgate.Name)
	}
}

// TestGoalFourFromProfiles: with both builds profiled, goal 4 is read from
// their CPU outside nats-server, not from the rounds, whose store costs
// swing with the disk.
func TestGoalFourFromProfiles(t *testing.T) {
	us := time.Microsecond
	round := func(serve time.Duration) ShippedRound {
		// The floor's hops cost 100µs a call beyond the load generator's.
		return ShippedRound{ToolgateServeCPU: serve, FloorServeCPU: 1000 * us,
			Toolgate: Result{CPUPerCall: 150 * us}, Floor: Result{CPUPerCall: 250 * us}}
	}
	s := &Shipped{
		Rounds:   []ShippedRound{round(3000 * us)},
		Baseline: []ShippedRound{round(2500 * us)}, BaselineBinary: "first", BaselineRSSMiB: 612,
		Profile: "serve.prof",
		// toolgate: 1300 outside the server, the floor 200 and its hops 100: own 1000.
		Shares: ProfileShares{Total: 4000 * us, Server: 2700 * us}, FloorShares: ProfileShares{Total: 3200 * us, Server: 3000 * us},
		// the baseline: 2500 outside, its floor 100 and its hops 100: own 2300.
		BaselineShares: ProfileShares{Total: 5300 * us, Server: 2800 * us}, BaselineFloorShares: ProfileShares{Total: 3100 * us, Server: 3000 * us},
	}
	s.useMedianRound()
	if got := ownOutsideServer(s.Shares, s.FloorShares, floorHops(s.Rounds)); got != 1000*us {
		t.Fatalf("own outside the server = %v, want 1ms", got)
	}
	var b strings.Builder
	s.Print(&b)
	out := b.String()
	for _, want := range []string{"the baseline build's, same rounds (5)", "(goal 4: see (6))"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	// A collector's setting given by a wrapper as the baseline is read
	// from the two builds' collector CPU and memory.
	s.Baseline[0].ToolgateServeGC, s.Rounds[0].ToolgateServeGC = 40*us, 70*us
	b.Reset()
	s.Print(&b)
	out = b.String()
	for want, label := range map[string]string{"40µs": "its collector's CPU per call, each round", "70µs": "this build's, each round", "612MiB": "its serve's RSS after its rounds"} {
		if line := lineWith(out, label); !strings.HasSuffix(line, want) {
			t.Errorf("line %q: want it to end %s", line, want)
		}
	}
	line := lineWith(out, "the baseline build's, profiled alike (6)")
	if !strings.Contains(line, "2300µs") || !strings.Contains(line, "0.43") || !strings.HasSuffix(line, " met") {
		t.Errorf("goal 4 line %q: want the baseline's 2300µs, ratio 0.43, met", line)
	}
	// Without the baseline's profiles the rounds decide.
	s.BaselineShares = ProfileShares{}
	b.Reset()
	s.Print(&b)
	if line := lineWith(b.String(), "the baseline build's, same rounds (5)"); !strings.HasSuffix(line, "NOT MET") {
		t.Errorf("rounds line %q: own 1900µs against 1400µs is NOT MET", line)
	}
}

func lineWith(out, s string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// TestPrintServeSync: a run with serve's store not fsyncing every write
// says so and does not meet goal 3, whatever its figures.
func TestPrintServeSync(t *testing.T) {
	done := Result{Sent: 10, Done: 10}
	s := &Shipped{Toolgate: done, Floor: done, Raw: done, Rounds: []ShippedRound{{Toolgate: done, Floor: done}}}
	for _, c := range []struct {
		sync, header, goal3 string
	}{
		{"", "--sync always,", " met"},
		{"always", "--sync always,", " met"},
		{"interval", "--sync interval, NOT the shipped always", "NOT MET"},
	} {
		s.Sync = c.sync
		var b strings.Builder
		s.Print(&b)
		out := b.String()
		if !strings.Contains(out, c.header) {
			t.Errorf("sync %q: no %q in:\n%s", c.sync, c.header, out)
		}
		if line := lineWith(out, "goal 3: bench what ships"); !strings.HasSuffix(line, c.goal3) || (c.goal3 == " met" && strings.HasSuffix(line, "NOT MET")) {
			t.Errorf("sync %q: goal 3 line %q, want %q", c.sync, line, c.goal3)
		}
	}
}

// TestPrintModes: each sync mode's rows carry the three chains' rates and
// writes per call, the ratios are toolgate's over the floor's and the
// bare chain's, and fsyncs perf did not count are marked derived.
func TestPrintModes(t *testing.T) {
	sat := func(calls int) Result { return Result{Sent: calls, Done: calls, Elapsed: time.Second} }
	s := &Shipped{Modes: []SyncMode{
		{Sync: "always", Toolgate: sat(100), Floor: sat(200), Raw: sat(400), UnloadedRate: 50,
			ToolgateWrites: writesPerCall{File: 18, Deletes: 6, Fsyncs: 19.5, FsyncsCounted: true,
				Streams: []streamPerCall{{Name: "PIPE", Writes: 16}, {Name: "RES", Memory: true, Writes: 1}}},
			FloorWrites: writesPerCall{File: 18, Deletes: 6, FsyncsDerived: 18}},
		{Sync: "interval", Toolgate: sat(1000), Floor: sat(1000), Raw: sat(2000), UnloadedRate: 50},
	}}
	var b strings.Builder
	s.printModes(&b)
	out := b.String()
	for _, c := range []struct{ line, want string }{
		{"always     toolgate", "100/s"},
		{"always     toolgate", "19.50"},
		{"floor", "18.00 d"},
		{"toolgate/floor", "0.50"},
		{"toolgate/bare", "0.25"},
		{"--sync always:", "PIPE 16.00 (file), RES 1.00 (memory)"},
		{"interval   toolgate", "1000/s"},
	} {
		if line := lineWith(out, c.line); !strings.Contains(line, c.want) {
			t.Errorf("line %q: want %q in it; the table:\n%s", line, c.want, out)
		}
	}
}
