package bench

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/connect"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/subjects"
)

// Shipped is toolgate measured as a user runs it: `toolgate serve` as its
// own process with its defaults (the authenticated bus, one role per
// stage, sealed hops, --sync always, execute's default concurrency), load
// offered by this process connected as an agent with only its capability
// token, beside the bare chain and the floor chain run on serve's own
// server with the operator's credentials from its data directory.
type Shipped struct {
	Args []string // serve's command line after the binary
	// Sync is serve's --sync when the run set one (--serve-sync): not
	// what ships, whose store fsyncs every write.
	Sync string
	// Saturation series (the no-op tool, 1000 sessions), each with the
	// CPU the serve process used per call (ServeCPU) beside this
	// process's (Result.CPUPerCall).
	Toolgate, Floor, Raw            Result
	ToolgateServeCPU, FloorServeCPU time.Duration
	RawServeCPU                     time.Duration
	// ToolgateServeSys and FloorServeSys are the kernel's share of the
	// serve process's CPU per call (system time: writes and fsyncs).
	ToolgateServeSys, FloorServeSys time.Duration
	// ToolgateServeGC and FloorServeGC are the Go collector's share of it
	// (zero from a serve that does not export it).
	ToolgateServeGC, FloorServeGC time.Duration
	// ToolgateAllocs and FloorAllocs are the serve process's heap
	// allocations per call (zero from a serve that does not export them):
	// counts, steady where the machine's speed is not.
	ToolgateAllocs, FloorAllocs allocs
	// Rounds are the floor's and toolgate's saturation series, measured
	// in turn: the fields above hold the round of median own CPU, so one
	// burst of disk or scheduler noise does not decide the figure.
	Rounds []ShippedRound
	// Baseline, with BaselineBinary, are the same rounds of another
	// build's serve (the starting build, for goal 4), run in turn with
	// CPURounds in the same run.
	Baseline       []ShippedRound
	BaselineBinary string
	// CPURounds are this build's rounds in the sync mode CPUSync, the
	// last measured (interval unless the run chose one): the baseline's
	// rounds and the profiles are taken there, where CPU rather than the
	// disk bounds the run. Rounds are the first mode's.
	CPURounds []ShippedRound
	CPUSync   string
	// Modes are each sync mode's rates and store writes per call, as
	// shipped (always) first.
	Modes                   []SyncMode
	Unloaded, UnloadedFloor Result
	UnloadedRaw             Result
	Half, HalfFloor         Result
	HalfRate                int
	LoadAvg                 string
	ServeRSSMiB             float64
	// ReadsPerCall are the direct gets (key-value reads) per call during
	// toolgate's saturation series: a count, stable where times are not.
	ReadsPerCall   float64
	Profile        string // where the serve process's CPU profile was written
	ProfileSeconds int
	ProfileCalls   int
	Shares         ProfileShares // per call, from the profile
	profileErr     error
	// FloorProfile, FloorProfileCalls and FloorShares are the same for a
	// profile as long under the floor chain's saturation load. Serve's
	// CPU there is its server's, so beside Shares it shows whether
	// toolgate makes the server work more than the floor does.
	FloorProfile      string
	FloorProfileCalls int
	FloorShares       ProfileShares
	floorProfileErr   error
	// BaselineShares and BaselineFloorShares are the same two profiles of
	// the baseline build's serve, when it is measured and profiled.
	BaselineShares, BaselineFloorShares ProfileShares
	// BaselineRSSMiB is the baseline build's serve's RSS after its rounds:
	// beside ServeRSSMiB, what a build (or a collector's setting, given
	// by a wrapper) trades for its CPU.
	BaselineRSSMiB                   float64
	baselineProfileErr               error
	startGC                          time.Duration // the collector's CPU once serve was ready
	shippedSessions, shippedUnloaded int
}

// SyncMode is one serve's figures with one --sync: the saturation of
// toolgate and the chains (the median round's) and their latency
// unloaded, with the store's writes and fsyncs per call of each.
type SyncMode struct {
	Sync                                   string // serve's --sync
	Toolgate, Floor, Raw                   Result
	Unloaded, UnloadedFloor, UnloadedRaw   Result
	UnloadedRate                           int
	ToolgateWrites, FloorWrites, RawWrites writesPerCall
}

// ShippedRound is one pair of saturation series, the floor chain's and
// toolgate's, back to back.
type ShippedRound struct {
	Toolgate, Floor Result
	// ToolgateWrites and FloorWrites are the store's writes per call in
	// the series (fsyncs counted in a serve's first round only).
	ToolgateWrites, FloorWrites     writesPerCall
	ToolgateServeCPU, FloorServeCPU time.Duration
	ToolgateServeSys, FloorServeSys time.Duration
	ToolgateServeGC, FloorServeGC   time.Duration
	ToolgateAllocs, FloorAllocs     allocs
}

// allocs are heap allocations per call: objects and bytes.
type allocs struct{ objects, bytes float64 }

// shippedRounds is how many pairs measureShipped runs in the mode the
// builds' CPU is compared in, ratesRounds in the other.
const (
	shippedRounds = 5
	ratesRounds   = 3
)

func (r ShippedRound) ownCPU() time.Duration {
	return Shipped{Toolgate: r.Toolgate, Floor: r.Floor, ToolgateServeCPU: r.ToolgateServeCPU, FloorServeCPU: r.FloorServeCPU}.OwnCPU()
}

// ownUserCPU is ownCPU without serve's system time, toolgate's and the
// floor's server's alike.
func (r ShippedRound) ownUserCPU() time.Duration {
	return r.ownCPU() - r.ToolgateServeSys + r.FloorServeSys
}

// useMedianRound sets the saturation figures from the round whose own CPU
// per call is the median.
func (s *Shipped) useMedianRound() {
	if len(s.Rounds) == 0 {
		return
	}
	m := medianRound(s.Rounds)
	s.Toolgate, s.Floor, s.ToolgateServeCPU, s.FloorServeCPU = m.Toolgate, m.Floor, m.ToolgateServeCPU, m.FloorServeCPU
	s.ToolgateServeSys, s.FloorServeSys = m.ToolgateServeSys, m.FloorServeSys
	s.ToolgateServeGC, s.FloorServeGC = m.ToolgateServeGC, m.FloorServeGC
	s.ToolgateAllocs, s.FloorAllocs = m.ToolgateAllocs, m.FloorAllocs
}

// ownCostBaseline is toolgate's CPU per call above the floor chain's, as
// `make bench` printed it when the shipped series was first measured (one
// run, docs/performance.md). Goal 4 halves a baseline build's own CPU
// (make bench: the starting build's); where none is measured in the same
// run (--baseline-binary) the goal is read against this figure.
const ownCostBaseline = 953 * time.Microsecond

// profileSeconds is how long each profile of serve runs.
const profileSeconds = 20

// medianOwn is the median of rounds' own CPU per call.
func medianOwn(rounds []ShippedRound) time.Duration { return medianRound(rounds).ownCPU() }

// medianRound is the round of median own CPU among rounds (not empty).
func medianRound(rounds []ShippedRound) ShippedRound {
	rs := slices.Clone(rounds)
	slices.SortFunc(rs, func(a, b ShippedRound) int { return cmp.Compare(a.ownCPU(), b.ownCPU()) })
	return rs[len(rs)/2]
}

// LoadGen is this process's CPU per call while it offered load to
// toolgate: publishing, and reading results.
func (s Shipped) LoadGen() time.Duration { return s.Toolgate.CPUPerCall }

// FloorCPU is the floor chain's CPU per call: the server's (in the serve
// process) and its hops' (in this process, whose share for publishing and
// reading results, LoadGen, is taken off).
func (s Shipped) FloorCPU() time.Duration {
	return s.FloorServeCPU + max(s.Floor.CPUPerCall-s.LoadGen(), 0)
}

// OwnCPU is toolgate's process CPU per call above the floor's.
func (s Shipped) OwnCPU() time.Duration { return s.ToolgateServeCPU - s.FloorCPU() }

// serveProc is a `toolgate serve` process the bench started.
type serveProc struct {
	cmd           *exec.Cmd
	done          chan struct{}
	url, data     string
	metrics, prof string
	stderr        *bytes.Buffer
}

// serveOpts are the settings startServe gives serve beyond its defaults.
type serveOpts struct {
	profile bool   // serve pprof, to be profiled
	sync    string // --sync, when not the default (always)
}

// startServe runs bin's `serve` with its defaults and what the bench must
// say: where its data and listener are, the key set the bench's tokens are
// signed with, the example tools (the no-op tool among them), where
// /readyz (and with o.profile, pprof) is served, and o.sync.
func startServe(ctx context.Context, bin, dir string, cred credentials, o serveOpts) (*serveProc, []string, error) {
	jwks, err := cred.key.PublicJWKS()
	if err != nil {
		return nil, nil, err
	}
	keys := filepath.Join(dir, "shipped-jwks.json")
	if err := os.WriteFile(keys, jwks, 0o600); err != nil {
		return nil, nil, err
	}
	listen, err := freeAddr()
	if err != nil {
		return nil, nil, err
	}
	metrics, err := freeAddr()
	if err != nil {
		return nil, nil, err
	}
	p := &serveProc{url: "nats://" + listen, data: filepath.Join(dir, "shipped"), metrics: metrics, done: make(chan struct{}),
		stderr: &bytes.Buffer{}}
	args := []string{"serve", "--data", p.data, "--listen", listen, "--examples",
		"--jwks", keys, "--token-issuer", benchIssuer, "--token-audience", benchAudience,
		"--metrics-addr", metrics, "--log-level", "error"}
	if o.sync != "" {
		args = append(args, "--sync", o.sync)
	}
	if o.profile {
		if p.prof, err = freeAddr(); err != nil {
			return nil, nil, err
		}
		args = append(args, "--pprof-addr", p.prof)
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = io.Discard, p.stderr
	if err := p.cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("starting serve: %w", err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(time.Minute)
	for !ready(metrics) {
		select {
		case <-p.done:
			return nil, nil, fmt.Errorf("serve exited before it was ready: %s", strings.TrimSpace(p.stderr.String()))
		case <-ctx.Done():
			p.stop()
			return nil, nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, nil, errors.New("serve not ready within a minute")
		}
	}
	return p, args, nil
}

// stop ends serve as it is meant to be stopped (SIGTERM), killing it after
// 30 s.
func (p *serveProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// cpu is the CPU time, user and system, the serve process has used so far
// (/proc/<pid>/stat, in the kernel's USER_HZ ticks of 10 ms).
func (p *serveProc) cpu() time.Duration {
	d, _ := procCPU(p.cmd.Process.Pid)
	return d
}

// sys is the serve process's system time so far.
func (p *serveProc) sys() time.Duration {
	_, d, _ := procTimes(p.cmd.Process.Pid)
	return d
}

// procCPU reads utime and stime of pid from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	u, s, err := procTimes(pid)
	return u + s, err
}

// procTimes reads utime and stime of pid from /proc/<pid>/stat apart.
func procTimes(pid int) (user, sys time.Duration, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name may hold spaces and parentheses: the fields
	// proper follow its last ')'. utime and stime are fields 14 and 15,
	// the 12th and 13th after it.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("unexpected /proc stat format")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, 0, errors.New("unexpected /proc stat format")
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, err
	}
	const userHZ = 100 // sysconf(_SC_CLK_TCK) on every Linux Go runs on
	return time.Duration(u) * time.Second / userHZ, time.Duration(s) * time.Second / userHZ, nil
}

// rss is the serve process's resident set in MiB.
func (p *serveProc) rss() float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// saturateServe is t.saturate with the serve process's CPU per call.
func (t *target) saturateServe(ctx context.Context, p *serveProc, name string, n, conc int) (Result, time.Duration, error) {
	r, c, err := t.saturateServeCost(ctx, p, name, n, conc)
	return r, c.cpu, err
}

// serveCost is the serve process's CPU per call during a series, with the
// kernel's share (system time) and the Go collector's.
type serveCost struct {
	cpu, sys, gc time.Duration
	allocs       allocs
}

// saturateServeCost is saturateServe with the shares of its CPU.
func (t *target) saturateServeCost(ctx context.Context, p *serveProc, name string, n, conc int) (Result, serveCost, error) {
	c0, s0 := p.cpu(), p.sys()
	m0 := p.counters(gcCPUSeconds, mallocsTotal, allocBytesTotal)
	r, err := t.saturate(ctx, name, n, conc)
	if err != nil || r.Done == 0 {
		return r, serveCost{}, err
	}
	c1, s1 := p.cpu(), p.sys()
	m1 := p.counters(gcCPUSeconds, mallocsTotal, allocBytesTotal)
	per := func(d time.Duration) time.Duration { return d / time.Duration(r.Done) }
	calls := float64(r.Done)
	return r, serveCost{cpu: per(c1 - c0), sys: per(s1 - s0), gc: per(time.Duration((m1[0] - m0[0]) * float64(time.Second))),
		allocs: allocs{objects: (m1[1] - m0[1]) / calls, bytes: (m1[2] - m0[2]) / calls}}, nil
}

// Counters of serve's metrics the bench reads: the Go collector's CPU
// time, and the heap allocations so far.
const (
	gcCPUSeconds    = "go_cpu_classes_gc_total_cpu_seconds_total"
	mallocsTotal    = "go_memstats_mallocs_total"
	allocBytesTotal = "go_memstats_alloc_bytes_total"
)

// gcCPU is the CPU time the serve process's Go collector has used so far,
// as its metrics endpoint reports it; zero where it does not.
func (p *serveProc) gcCPU() time.Duration {
	return time.Duration(p.counter(gcCPUSeconds) * float64(time.Second))
}

// finished is how many calls serve has ended.
func (p *serveProc) finished() float64 { return p.counter("toolgate_invocations_finished_total") }

// counter is the sum of a counter's series on serve's metrics, 0 when it
// exports none.
func (p *serveProc) counter(name string) float64 { return p.counters(name)[0] }

// counters are counter for each of names, from one reading of serve's
// metrics.
func (p *serveProc) counters(names ...string) []float64 {
	sums := make([]float64, len(names))
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		return sums
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return sums
	}
	for i, name := range names {
		for _, m := range families[name].GetMetric() {
			sums[i] += m.GetCounter().GetValue()
		}
	}
	return sums
}

// measureShipped starts `toolgate serve` from bin and measures it, once
// with the store as shipped (--sync always) and once with --sync interval,
// each serve in turn (with sync set, in that mode alone): saturation of the
// no-op tool with 1000 sessions and latency unloaded, beside the floor
// chain and the bare chain on serve's own server, with the store's writes
// and fsyncs per call of each. As shipped, it also measures latency at
// half of that saturation. In the last mode, where CPU rather than the
// disk bounds the run, it measures the baseline build in the same rounds
// and with profile writes CPU profiles of serve under the same saturation
// load.
func measureShipped(ctx context.Context, bin, dir string, n int, d time.Duration, profile, baseline, sync string) (*Shipped, error) {
	cred, err := newCredentials()
	if err != nil {
		return nil, err
	}
	s := &Shipped{Sync: sync, shippedSessions: 1000, shippedUnloaded: 50}
	modes := []string{"", "interval"} // "": serve's default, always
	if sync != "" {
		modes = []string{sync}
	}
	for i, mode := range modes {
		mdir := filepath.Join(dir, "sync-"+cmp.Or(mode, "always"))
		if err := os.MkdirAll(mdir, 0o700); err != nil {
			return nil, err
		}
		if err := s.measureMode(ctx, bin, mdir, cred, mode, i == 0, i == len(modes)-1, n, d, profile, baseline); err != nil {
			return nil, fmt.Errorf("--sync %s: %w", cmp.Or(mode, "always"), err)
		}
	}
	s.LoadAvg = loadAvg()
	return s, nil
}

// measureMode measures bin's serve in dir with --sync mode (its default
// where empty) into s: a SyncMode, and with primary the figures the goals
// are held to. With cpu, the mode where the builds' CPU is compared, the
// baseline build's serve takes its rounds in turn with this one's, and
// with profile both are profiled.
func (s *Shipped) measureMode(ctx context.Context, bin, dir string, cred credentials, mode string, primary, cpu bool,
	n int, d time.Duration, profile, baseline string) error {
	opts := serveOpts{profile: cpu && profile != "", sync: mode}
	m, err := openServe(ctx, bin, dir, cred, opts)
	if err != nil {
		return err
	}
	defer m.close()
	p, floor, tool := m.p, m.floor, m.tool
	sm := SyncMode{Sync: cmp.Or(mode, "always")}
	if primary {
		s.Args, s.startGC = m.args, p.gcCPU()
	}
	var base *servedRounds
	if cpu && baseline != "" {
		// The build the goal is measured against, its own serve beside this
		// one's: idle while the other is measured.
		bdir := filepath.Join(dir, "baseline")
		if err := os.MkdirAll(bdir, 0o700); err != nil {
			return err
		}
		if base, err = openServe(ctx, baseline, bdir, cred, opts); err != nil {
			return fmt.Errorf("baseline %s: %w", baseline, err)
		}
		defer base.close()
		s.BaselineBinary = baseline
	}
	raw, stopRaw, err := rawChain(ctx, m.op, 256, nil)
	if err != nil {
		return err
	}
	defer stopRaw()
	rawWrites, err := newWriteCounter(m.op, p.cmd.Process.Pid, m.always, func(s string) bool { return s == "BENCH_RAW" })
	if err != nil {
		return err
	}

	const publishers = 64
	var rawCPU time.Duration
	if sm.RawWrites, err = rawWrites.count(ctx, true, func() (int, error) {
		var err error
		sm.Raw, rawCPU, err = raw.saturateServe(ctx, p, raw.name, n, publishers)
		return sm.Raw.Done, err
	}); err != nil {
		return fmt.Errorf("bare chain, saturation: %w", err)
	}
	if primary {
		s.Raw, s.RawServeCPU = sm.Raw, rawCPU
	}
	// Every read of a key-value store is a direct get request, which the
	// operator sees.
	var gets, calls atomic.Int64
	gsub, err := m.op.Subscribe(subjects.DirectGetKV, func(*nats.Msg) { gets.Add(1) })
	if err != nil {
		return err
	}
	// The mode the builds are compared in takes the rounds the comparison
	// needs; the other fewer, for its rates and counts.
	rounds := shippedRounds
	if !cpu {
		rounds = ratesRounds
	}
	var mine []ShippedRound
	for i := range rounds {
		// The first round of each serve counts its fsyncs too; with a
		// baseline, the two builds take turns going first, so a drift of
		// the machine's speed favours neither.
		if base != nil && i%2 == 1 {
			r, err := base.round(ctx, n, publishers, i == 1)
			if err != nil {
				return fmt.Errorf("baseline: %w", err)
			}
			s.Baseline = append(s.Baseline, r)
		}
		r, err := m.round(ctx, n, publishers, i == 0)
		if err != nil {
			return err
		}
		calls.Add(int64(r.Toolgate.Done))
		mine = append(mine, r)
		if base != nil && i%2 == 0 {
			r, err := base.round(ctx, n, publishers, i == 0)
			if err != nil {
				return fmt.Errorf("baseline: %w", err)
			}
			s.Baseline = append(s.Baseline, r)
		}
	}
	_ = gsub.Unsubscribe()
	if cpu {
		s.CPURounds, s.CPUSync = mine, sm.Sync
	}
	if cpu && profile != "" {
		s.profileInTurns(ctx, m, base, profile, n, publishers)
	}
	if base != nil {
		s.BaselineRSSMiB = base.p.rss()
		// Stopped now, so the latency series below have the machine to
		// themselves.
		base.close()
	}
	med := medianRound(mine)
	sm.Toolgate, sm.Floor = med.Toolgate, med.Floor
	sm.ToolgateWrites, sm.FloorWrites = mine[0].ToolgateWrites, mine[0].FloorWrites
	// Unloaded is 50/s, or a fifth of saturation where that is less (a
	// loaded machine): a rate at which calls do not queue.
	sm.UnloadedRate = max(min(50, int(sm.Toolgate.Throughput()/5), int(sm.Floor.Throughput()/5)), 1)
	unloaded, err := latenciesInTurns(ctx, []*target{tool, floor, raw},
		[]string{"shipped unloaded", "shipped floor unloaded", "shipped raw unloaded"}, sm.UnloadedRate, d)
	if err != nil {
		return fmt.Errorf("unloaded: %w", err)
	}
	sm.Unloaded, sm.UnloadedFloor, sm.UnloadedRaw = unloaded[0], unloaded[1], unloaded[2]
	s.Modes = append(s.Modes, sm)
	if !primary {
		return nil
	}
	s.Rounds = mine
	s.useMedianRound()
	s.ServeRSSMiB = p.rss()
	s.ReadsPerCall = float64(gets.Load()) / float64(max(calls.Load(), 1))
	s.shippedUnloaded = sm.UnloadedRate
	s.Unloaded, s.UnloadedFloor, s.UnloadedRaw = sm.Unloaded, sm.UnloadedFloor, sm.UnloadedRaw
	s.HalfRate = max(int(s.Toolgate.Throughput()/2), 1)
	if s.Half, err = tool.latencyAt(ctx, "shipped at half", s.HalfRate, d); err != nil {
		return fmt.Errorf("toolgate, at half saturation: %w", err)
	}
	if s.HalfFloor, err = floor.latencyAt(ctx, "shipped floor at half", s.HalfRate, d); err != nil {
		return err
	}
	return nil
}

// unloadedTurns is how many turns latenciesInTurns splits a series into.
const unloadedTurns = 5

// latenciesInTurns measures the latency of each of ts at rate for d, in
// unloadedTurns turns of d/unloadedTurns, the targets taking turns and
// each turn starting with the next target: a drift of the machine over
// the series (the bare chain's p50 moved by 15 % between runs of the same
// code, measured apart) favours none of them. Each turn warms its target
// up first, as latencyAt does; the results hold every turn's calls.
func latenciesInTurns(ctx context.Context, ts []*target, names []string, rate int, d time.Duration) ([]Result, error) {
	// At least a call a turn; half a call's interval more, so that a turn
	// offers d's share of calls rounded rather than cut short.
	turns := max(1, min(unloadedTurns, int(float64(rate)*d.Seconds())))
	turn := d/time.Duration(turns) + time.Second/time.Duration(2*rate)
	out := make([]Result, len(ts))
	for t := range turns {
		for k := range ts {
			i := (t + k) % len(ts)
			r, err := ts[i].latencyAt(ctx, names[i], rate, turn)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", names[i], err)
			}
			o := &out[i]
			o.Name = r.Name
			o.Sent += r.Sent
			o.Done += r.Done
			o.Elapsed += r.Elapsed
			o.Latencies = append(o.Latencies, r.Latencies...)
		}
	}
	for i := range out {
		slices.Sort(out[i].Latencies)
	}
	return out, nil
}

// withSuffix is path with suffix before its extension.
func withSuffix(path, suffix string) string {
	return strings.TrimSuffix(path, filepath.Ext(path)) + suffix + filepath.Ext(path)
}

// profileInTurns profiles this build's serve (m), under toolgate's load
// and under its floor chain's, and with base the baseline build's alike,
// into path and its -floor, -baseline and -baseline-floor. Each series
// is taken in two windows of half profileSeconds, in the order this
// build, its floor, the baseline, its floor, and then backwards: every
// series' windows then centre on one moment, so a drift of the disk's
// speed over those minutes, which moves CPU per call by more than goal 4
// itself, favours neither build, nor a build over its floor.
func (s *Shipped) profileInTurns(ctx context.Context, m, base *servedRounds, path string, n, conc int) {
	this, thisFloor := m.series(path), m.floorSeries(withSuffix(path, "-floor"))
	turns := []*profileSeries{this, thisFloor}
	var baseline, baselineFloor *profileSeries
	if base != nil {
		baseline = base.series(withSuffix(path, "-baseline"))
		baselineFloor = base.floorSeries(withSuffix(path, "-baseline-floor"))
		turns = append(turns, baseline, baselineFloor)
	}
	for _, k := range inTurns(len(turns)) {
		turns[k].window(ctx, profileSeconds/2, n, conc)
	}
	s.Profile, s.ProfileSeconds = path, profileSeconds
	s.ProfileCalls, s.Shares, s.profileErr = this.shares()
	s.FloorProfile = thisFloor.path
	s.FloorProfileCalls, s.FloorShares, s.floorProfileErr = thisFloor.shares()
	if base != nil {
		var errs [2]error
		_, s.BaselineShares, errs[0] = baseline.shares()
		_, s.BaselineFloorShares, errs[1] = baselineFloor.shares()
		s.baselineProfileErr = errors.Join(errs[:]...)
	}
}

// inTurns is the order n series take their two windows in: each in turn,
// then backwards, so that each series' windows centre on the same moment.
func inTurns(n int) []int {
	order := make([]int, 2*n)
	for i := range n {
		order[i], order[2*n-1-i] = i, i
	}
	return order
}

// profileSeries is the CPU profile of one serve under one load, toolgate's
// or its floor chain's, taken in windows.
type profileSeries struct {
	path   string // where the windows, merged, are written
	p      *serveProc
	t      *target
	ended  func() float64 // calls ended so far
	parts  [][]byte       // each window's profile
	allocs [][]byte       // each window's allocations (an allocs profile's growth over it)
	calls  int            // calls ended in the windows
	cpu    time.Duration  // serve's CPU in the windows, as the kernel counts it
	err    error
}

func (m *servedRounds) series(path string) *profileSeries {
	return &profileSeries{path: path, p: m.p, t: m.tool, ended: m.p.finished}
}

func (m *servedRounds) floorSeries(path string) *profileSeries {
	return &profileSeries{path: path, p: m.p, t: m.floor, ended: func() float64 { return float64(m.floor.done.Load()) }}
}

// window profiles the series' serve for seconds under its load; after a
// failed window the series takes no more.
func (ps *profileSeries) window(ctx context.Context, seconds, n, conc int) {
	if ps.err != nil {
		return
	}
	b, allocs, calls, cpu, err := profileUnderLoad(ctx, ps.p, ps.t, seconds, n, conc, ps.ended)
	if err != nil {
		ps.err = err
		return
	}
	ps.parts = append(ps.parts, b)
	ps.allocs = append(ps.allocs, allocs)
	ps.calls += calls
	ps.cpu += cpu
}

// shares merges the series' windows into one profile, writes it to its
// path and returns the calls ended in them and the shares per call.
func (ps *profileSeries) shares() (int, ProfileShares, error) {
	if ps.err != nil {
		return ps.calls, ProfileShares{}, ps.err
	}
	b, err := mergeProfiles(ps.parts)
	if err != nil {
		return ps.calls, ProfileShares{}, err
	}
	if err := os.WriteFile(ps.path, b, 0o644); err != nil {
		return ps.calls, ProfileShares{}, err
	}
	if len(ps.allocs) > 0 {
		// Beside it, what serve allocated in the same windows.
		a, err := mergeProfiles(ps.allocs)
		if err != nil {
			return ps.calls, ProfileShares{}, err
		}
		if err := os.WriteFile(allocsPath(ps.path), a, 0o644); err != nil {
			return ps.calls, ProfileShares{}, err
		}
	}
	sh, err := profileShares(b, ps.calls)
	if ps.calls > 0 {
		sh.Kernel = ps.cpu / time.Duration(ps.calls)
	}
	return ps.calls, sh, err
}

// ownOutsideServer is toolgate's own CPU per call read from the profiles:
// serve's CPU outside nats-server's code under toolgate's load, less the
// same under the floor chain's (the collector's and scheduler's work for
// the server) and less the floor's hops (their CPU in this process, hops):
// the rounds' measure without the server's CPU on either side. The
// store's fsyncs, whose cost swings with the disk, are the server's and
// fall out; the floor makes the server do the same writes.
func ownOutsideServer(tool, floor ProfileShares, hops time.Duration) time.Duration {
	return (tool.Total - tool.Server) - (floor.Total - floor.Server) - hops
}

// floorHops is the CPU per call of the floor chain's hops in this process
// in rounds' median round, less the load generator's.
func floorHops(rounds []ShippedRound) time.Duration {
	if len(rounds) == 0 {
		return 0
	}
	m := medianRound(rounds)
	return max(m.Floor.CPUPerCall-m.Toolgate.CPUPerCall, 0)
}

// cpuRounds are this build's rounds in the mode its profiles and the
// baseline's rounds were taken in.
func (s *Shipped) cpuRounds() []ShippedRound {
	if len(s.CPURounds) > 0 {
		return s.CPURounds
	}
	return s.Rounds
}

// separateCPU reports whether the builds' CPU was compared in a sync mode
// other than the one the goals are read in.
func (s *Shipped) separateCPU() bool {
	return len(s.CPURounds) > 0 && s.CPUSync != cmp.Or(s.Sync, "always")
}

// profiledGoal reports whether goal 4 is read from the profiles: both
// builds were profiled.
func (s *Shipped) profiledGoal() bool {
	return len(s.Baseline) > 0 && s.Profile != "" && s.profileErr == nil && s.floorProfileErr == nil &&
		s.baselineProfileErr == nil && s.BaselineShares.Total > 0
}

// servedRounds is a serve process ready for the saturation rounds: the
// floor chain on its server and an agent connected to it.
type servedRounds struct {
	p           *serveProc
	args        []string
	op          *nats.Conn // the operator's connection
	floor, tool *target
	always      bool // the store fsyncs every write
	// floorWrites and toolWrites count the store's writes of the floor
	// chain's streams and of all others (toolgate's).
	floorWrites, toolWrites *writeCounter
	closers                 []func()
}

// openServe starts bin's serve in dir and connects the floor chain and the
// agent to it.
func openServe(ctx context.Context, bin, dir string, cred credentials, o serveOpts) (_ *servedRounds, err error) {
	p, args, err := startServe(ctx, bin, dir, cred, o)
	if err != nil {
		return nil, err
	}
	m := &servedRounds{p: p, args: args, closers: []func(){p.stop}, always: o.sync == "" || o.sync == "always"}
	defer func() {
		if err != nil { // what was opened is closed, serve stopped
			m.close()
		}
	}()
	// The chains are set up by the operator, the one role that may create
	// streams, with the credentials serve wrote into its data directory.
	if m.op, err = nats.Connect(p.url, nats.Name("toolgate-bench-operator"),
		busauth.CredentialsOption(node.CredsPath(p.data, busauth.RoleOperator))); err != nil {
		return nil, fmt.Errorf("operator: %w", err)
	}
	m.closers = append(m.closers, m.op.Close)
	floor, stopFloor, err := rawChain(ctx, m.op, 256, pipelineWrites)
	if err != nil {
		return nil, err
	}
	m.floor = floor
	m.closers = append(m.closers, stopFloor)
	pid := p.cmd.Process.Pid
	if m.floorWrites, err = newWriteCounter(m.op, pid, m.always, func(s string) bool { return strings.Contains(s, "BENCH_RAW_WRITES") }); err != nil {
		return nil, err
	}
	if m.toolWrites, err = newWriteCounter(m.op, pid, m.always, func(s string) bool { return !chainStream(s) }); err != nil {
		return nil, err
	}
	// The load generator is an agent: its connection carries nothing but
	// one of its capability tokens (connect.Options, as the command line
	// and `toolgate mcp` connect).
	tool, stopTool, agent, err := agentTarget(ctx, p.url, cred, 1000)
	if err != nil {
		return nil, err
	}
	m.tool = tool
	m.closers = append(m.closers, agent.Close, stopTool)
	return m, nil
}

// close undoes openServe, last opened first; once.
func (m *servedRounds) close() {
	for i := len(m.closers) - 1; i >= 0; i-- {
		m.closers[i]()
	}
	m.closers = nil
}

// round is one pair of saturation series on m: the floor chain's, then
// toolgate's, each with the store's writes per call, and with fsyncs
// their fsyncs.
func (m *servedRounds) round(ctx context.Context, n, conc int, fsyncs bool) (ShippedRound, error) {
	var r ShippedRound
	var fc, tc serveCost
	var err error
	if r.FloorWrites, err = m.floorWrites.count(ctx, fsyncs, func() (int, error) {
		var err error
		r.Floor, fc, err = m.floor.saturateServeCost(ctx, m.p, m.floor.name, n, conc)
		return r.Floor.Done, err
	}); err != nil {
		return r, fmt.Errorf("floor chain, saturation: %w", err)
	}
	if r.ToolgateWrites, err = m.toolWrites.count(ctx, fsyncs, func() (int, error) {
		var err error
		r.Toolgate, tc, err = m.tool.saturateServeCost(ctx, m.p, m.tool.name, n, conc)
		return r.Toolgate.Done, err
	}); err != nil {
		return r, fmt.Errorf("toolgate, saturation: %w", err)
	}
	r.FloorServeCPU, r.FloorServeSys, r.FloorServeGC, r.FloorAllocs = fc.cpu, fc.sys, fc.gc, fc.allocs
	r.ToolgateServeCPU, r.ToolgateServeSys, r.ToolgateServeGC, r.ToolgateAllocs = tc.cpu, tc.sys, tc.gc, tc.allocs
	return r, nil
}

// agentTarget is pipelineTarget on a connection of its own made the way
// an agent connects: its first session's capability token as the connect
// token, with the inbox prefix that token may use.
func agentTarget(ctx context.Context, url string, cred credentials, sessions int) (*target, func(), *nats.Conn, error) {
	// The sessions' tokens are minted first; the connection carries the
	// first one.
	toks, err := sessionTokens(cred, sessions, false)
	if err != nil {
		return nil, nil, nil, err
	}
	co := connect.Options{URL: url, Token: toks[0], Name: "toolgate-bench-agent"}
	nc, err := co.Connect()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("agent: %w", err)
	}
	t, stop, err := targetWithTokens(nc, toks, false)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	t.name = fmt.Sprintf("toolgate serve, %d sessions, agent", sessions)
	return t, stop, nc, nil
}

// profileUnderLoad fetches a CPU profile of seconds from serve's pprof
// endpoint while offering t saturation load in rounds of n, and returns it
// with serve's allocations over the same window (pprof's allocs profile
// as it stood after, less before), how many calls ended meanwhile (by
// ended, a running count; the calls offered, if it does not say) and
// serve's CPU over the window.
func profileUnderLoad(ctx context.Context, p *serveProc, t *target, seconds, n, conc int, ended func() float64) (cpuProf, allocs []byte, calls int, cpu time.Duration, err error) {
	type fetched struct {
		body   []byte
		allocs []byte // the allocs profile as the window closed
		err    error
		ended  float64       // calls ended once the profile was done
		cpu    time.Duration // serve's CPU then, as the kernel counts it
	}
	allocsBefore, err := fetchPprof(p.prof, "allocs", 30*time.Second)
	if err != nil {
		return nil, nil, 0, 0, err
	}
	got := make(chan fetched, 1)
	before, cpu0 := ended(), p.cpu()
	go func() {
		b, err := fetchPprof(p.prof, fmt.Sprintf("profile?seconds=%d", seconds), time.Duration(seconds+30)*time.Second)
		if err != nil {
			got <- fetched{err: err}
			return
		}
		// Read as the window closes, not once the round of load under way
		// ends, which may be seconds later.
		f := fetched{body: b, ended: ended(), cpu: p.cpu()}
		f.allocs, f.err = fetchPprof(p.prof, "allocs", 30*time.Second)
		got <- f
	}()
	for {
		select {
		case f := <-got:
			if f.err != nil {
				return nil, nil, calls, 0, f.err
			}
			if ended := int(f.ended - before); ended > 0 {
				calls = ended
			}
			delta, err := profileDelta(allocsBefore, f.allocs)
			return f.body, delta, calls, f.cpu - cpu0, err
		default:
		}
		if _, err := t.saturate(ctx, "profile", n, conc); err != nil {
			return nil, nil, calls, 0, err
		}
		calls += n
	}
}

// fetchPprof is the body of serve's /debug/pprof/ endpoint path at addr.
func fetchPprof(addr, path string, timeout time.Duration) ([]byte, error) {
	c := http.Client{Timeout: timeout}
	resp, err := c.Get(fmt.Sprintf("http://%s/debug/pprof/%s", addr, path))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("pprof: %s: %s", resp.Status, b)
	}
	return b, err
}

// Print writes the shipped figures with goals 3 and 4 of the shipped
// configuration, each met or NOT MET.
func (s *Shipped) Print(w io.Writer) {
	fmt.Fprintf(w, "\nshipped: `toolgate %s`\n", strings.Join(s.Args, " "))
	sync := "--sync always"
	if s.Sync != "" && s.Sync != "always" {
		sync = "--sync " + s.Sync + ", NOT the shipped always"
	}
	fmt.Fprintf(w, "  (its own process: authenticated bus, one role per stage, sealed hops, %s, execute's default concurrency;\n", sync)
	fmt.Fprintf(w, "   load from the bench process connected as an agent with a capability token, %d sessions; the chains on serve's server\n", s.shippedSessions)
	fmt.Fprintf(w, "   with the operator's credentials; %d CPU %s/%s; load average at the end %s)\n", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, s.LoadAvg)
	fmt.Fprintf(w, "%-44s %12s %12s %12s %8s %8s  %s\n", "figure", "toolgate", "floor", "bare", "ratio", "goal", "")
	fmt.Fprintf(w, "%-44s %10.0f/s %10.0f/s %10.0f/s %8.2f %8s  %s\n", "saturation, no-op tool",
		s.Toolgate.Throughput(), s.Floor.Throughput(), s.Raw.Throughput(),
		s.Toolgate.Throughput()/max(s.Floor.Throughput(), 1e-9), ">=0.60", verdict(s.Toolgate.Throughput() >= 0.6*s.Floor.Throughput()))
	lat := func(name string, a, f, b Result, q float64, goal float64) {
		x, y := a.Quantile(q), f.Quantile(q)
		r := float64(x) / max(float64(y), 1)
		bare := "-"
		if b.Done > 0 {
			bare = ms(b.Quantile(q))
		}
		fmt.Fprintf(w, "%-44s %12s %12s %12s %8.2f %8s  %s\n", name, ms(x), ms(y), bare, r,
			fmt.Sprintf("<=%.1f", goal), verdict(r <= goal))
	}
	lat(fmt.Sprintf("latency unloaded (%d/s) p50", s.shippedUnloaded), s.Unloaded, s.UnloadedFloor, s.UnloadedRaw, 0.5, 1.3)
	lat(fmt.Sprintf("latency unloaded (%d/s) p99", s.shippedUnloaded), s.Unloaded, s.UnloadedFloor, s.UnloadedRaw, 0.99, 1.5)
	lat(fmt.Sprintf("latency at half saturation (%d/s) p50", s.HalfRate), s.Half, s.HalfFloor, Result{}, 0.5, 1.5)
	us := func(d time.Duration) string { return fmt.Sprintf("%.0fµs", float64(d.Nanoseconds())/1000) }
	fmt.Fprintf(w, "%-44s %12s %12s %12s\n", "CPU per call, serve process", us(s.ToolgateServeCPU), us(s.FloorServeCPU), us(s.RawServeCPU))
	fmt.Fprintf(w, "%-44s %12s %12s\n", "  of which the kernel's (system time)", us(s.ToolgateServeSys), us(s.FloorServeSys))
	if s.ToolgateServeGC > 0 {
		fmt.Fprintf(w, "%-44s %12s %12s\n", "  of which the Go collector's", us(s.ToolgateServeGC), us(s.FloorServeGC))
	}
	fmt.Fprintf(w, "%-44s %12s %12s %12s\n", "CPU per call, bench process", us(s.Toolgate.CPUPerCall), us(s.Floor.CPUPerCall), us(s.Raw.CPUPerCall))
	fmt.Fprintf(w, "%-44s %12s %12s\n", "CPU per call, toolgate / floor (1)", us(s.ToolgateServeCPU), us(s.FloorCPU()))
	own := s.OwnCPU()
	eachRound := func(rounds []ShippedRound, f func(ShippedRound) time.Duration) string {
		var each []string
		for _, r := range rounds {
			each = append(each, us(f(r)))
		}
		return strings.Join(each, " ")
	}
	if len(s.Baseline) > 0 {
		fmt.Fprintf(w, "%-44s %12s\n", "toolgate's own CPU per call (2)", us(own))
	} else {
		fmt.Fprintf(w, "%-44s %12s %12s %12s %8.2f %8s  %s\n", "toolgate's own CPU per call (2)", us(own), "", "",
			float64(own)/float64(ownCostBaseline), "<=0.50", verdict(2*own <= ownCostBaseline))
	}
	if len(s.Rounds) > 1 {
		fmt.Fprintf(w, "%-44s %s (the median is above)\n", "  own CPU per call, each floor/toolgate round", eachRound(s.Rounds, ShippedRound.ownCPU))
		fmt.Fprintf(w, "%-44s %s\n", "  the same without system time (3)", eachRound(s.Rounds, ShippedRound.ownUserCPU))
	}
	if s.separateCPU() {
		// The builds are compared in another sync mode's rounds.
		own = medianOwn(s.CPURounds)
		fmt.Fprintf(w, "%-44s %12s\n", "toolgate's own CPU, --sync "+s.CPUSync+" (2)", us(own))
		fmt.Fprintf(w, "%-44s %s\n", "  each of its rounds", eachRound(s.CPURounds, ShippedRound.ownCPU))
	}
	if len(s.Baseline) > 0 {
		b := medianOwn(s.Baseline)
		goal, v := "<=0.50", verdict(2*own <= b)
		if s.profiledGoal() {
			goal, v = "", "(goal 4: see (6))"
		}
		fmt.Fprintf(w, "%-44s %12s %12s %12s %8.2f %8s  %s\n", "the baseline build's, same rounds (5)", us(b), "", "",
			float64(own)/float64(max(b, 1)), goal, v)
		fmt.Fprintf(w, "%-44s %s\n", "  each of its rounds", eachRound(s.Baseline, ShippedRound.ownCPU))
		fmt.Fprintf(w, "%-44s %s\n", "  the same without system time (3)", eachRound(s.Baseline, ShippedRound.ownUserCPU))
		var obj []string
		for _, r := range s.Baseline {
			obj = append(obj, fmt.Sprintf("%.0f", r.ToolgateAllocs.objects))
		}
		fmt.Fprintf(w, "%-44s %s\n", "  its heap allocations per call, each round", strings.Join(obj, " "))
		fmt.Fprintf(w, "%-44s %s\n", "  its collector's CPU per call, each round", eachRound(s.Baseline, func(r ShippedRound) time.Duration { return r.ToolgateServeGC }))
		fmt.Fprintf(w, "%-44s %s\n", "  this build's, each round", eachRound(s.cpuRounds(), func(r ShippedRound) time.Duration { return r.ToolgateServeGC }))
		fmt.Fprintf(w, "%-44s %10.0fMiB\n", "  its serve's RSS after its rounds", s.BaselineRSSMiB)
	}
	if s.ToolgateAllocs.objects > 0 {
		fmt.Fprintf(w, "%-44s %12s %12s\n", "heap allocations per call, serve process",
			fmt.Sprintf("%.0f", s.ToolgateAllocs.objects), fmt.Sprintf("%.0f", s.FloorAllocs.objects))
		fmt.Fprintf(w, "%-44s %12s %12s\n", "  their bytes", fmt.Sprintf("%.0fKiB", s.ToolgateAllocs.bytes/1024),
			fmt.Sprintf("%.0fKiB", s.FloorAllocs.bytes/1024))
	}
	fmt.Fprintf(w, "%-44s %12.2f\n", "key-value reads (direct gets) per call", s.ReadsPerCall)
	fmt.Fprintf(w, "%-44s %10.0fMiB\n", "serve's RSS after the saturation series", s.ServeRSSMiB)
	fmt.Fprintf(w, "(1) toolgate: the serve process alone; floor: the server's share in the serve process plus its hops' in the bench\n")
	fmt.Fprintf(w, "    process, less the bench's own load-generator cost per call (%s, measured offering load to toolgate)\n", us(s.LoadGen()))
	if len(s.Baseline) > 0 {
		fmt.Fprintf(w, "(2) toolgate's CPU per call minus the floor's; goal 4: half of the baseline build's (5)\n")
	} else {
		fmt.Fprintf(w, "(2) toolgate's CPU per call minus the floor's; goal 4: half of %s, the first shipped build's figure when first\n", us(ownCostBaseline))
		fmt.Fprintf(w, "    measured, in another run (--baseline-binary measures a build in this one: make bench the starting build)\n")
	}
	fmt.Fprintf(w, "(3) serve's user time per call minus the floor's (its server's user time and its hops' CPU): both make the same\n")
	fmt.Fprintf(w, "    durable writes, whose kernel time swings with the disk from round to round\n")
	if len(s.Baseline) > 0 {
		fmt.Fprintf(w, "(5) the median own CPU of the same rounds of `%s serve --sync %s`, its own process beside this one's,\n",
			s.BaselineBinary, cmp.Or(s.CPUSync, s.Sync, "always"))
		fmt.Fprintf(w, "    the two builds taking turns (make bench measures the starting build there, whose figure goal 4 halves)\n")
	}
	shipped := s.Sync == "" || s.Sync == "always"
	fmt.Fprintf(w, "%-44s %12s  %s\n", "goal 3: bench what ships", "", verdict(shipped && s.Toolgate.Done == s.Toolgate.Sent && s.Toolgate.Done > 0))
	s.printModes(w)
	if s.Profile != "" {
		if s.profileErr != nil {
			fmt.Fprintf(w, "serve CPU profile: %v\n", s.profileErr)
		} else {
			fmt.Fprintf(w, "serve CPU profile, --sync %s (%d s in two windows (7), %d calls ended at saturation): %s (go tool pprof -top %s)\n",
				cmp.Or(s.CPUSync, s.Sync, "always"), s.ProfileSeconds, s.ProfileCalls, s.Profile, s.Profile)
			sh := s.Shares
			fmt.Fprintf(w, "%-44s %12s\n", "  serve's CPU per call in the profile", us(sh.Total))
			fmt.Fprintf(w, "%-44s %12s\n", "  the same window as the kernel counts it (4)", us(sh.Kernel))
			fmt.Fprintf(w, "%-44s %12s\n", "  of which toolgate's stages and runner", us(sh.Stages))
			fmt.Fprintf(w, "%-44s %12s\n", "  of which Ed25519 signing", us(sh.Sign))
			fmt.Fprintf(w, "%-44s %12s\n", "  of which JSON (every caller)", us(sh.JSON))
			fmt.Fprintf(w, "%-44s %12s\n", "  of which nats-server (the floor's among it)", us(sh.Server))
			fmt.Fprintf(w, "serve's allocations in the same windows: %s (go tool pprof -sample_index=alloc_space -top %s)\n",
				allocsPath(s.Profile), allocsPath(s.Profile))
		}
		if s.floorProfileErr != nil {
			fmt.Fprintf(w, "floor chain's CPU profile: %v\n", s.floorProfileErr)
		} else {
			fs := s.FloorShares
			fmt.Fprintf(w, "floor chain's CPU profile (%d s in two windows, %d calls at saturation): %s\n", s.ProfileSeconds, s.FloorProfileCalls, s.FloorProfile)
			fmt.Fprintf(w, "%-44s %12s\n", "  serve's CPU per call in the profile", us(fs.Total))
			fmt.Fprintf(w, "%-44s %12s\n", "  the same window as the kernel counts it (4)", us(fs.Kernel))
			fmt.Fprintf(w, "%-44s %12s\n", "  of which nats-server", us(fs.Server))
			if s.profileErr == nil {
				fmt.Fprintf(w, "%-44s %12s\n", "  nats-server's per call, toolgate's less this", us(s.Shares.Server-fs.Server))
			}
		}
		if s.profileErr == nil && s.floorProfileErr == nil {
			own := ownOutsideServer(s.Shares, s.FloorShares, floorHops(s.cpuRounds()))
			fmt.Fprintf(w, "%-44s %12s\n", "toolgate's own CPU per call outside nats-server (6)", us(own))
			switch {
			case s.profiledGoal():
				b := ownOutsideServer(s.BaselineShares, s.BaselineFloorShares, floorHops(s.Baseline))
				fmt.Fprintf(w, "%-44s %12s %12s %12s %8.2f %8s  %s\n", "  the baseline build's, profiled alike (6)", us(b), "", "",
					float64(own)/float64(max(b, 1)), "<=0.50", verdict(2*own <= b))
				bs, bf := s.BaselineShares, s.BaselineFloorShares
				fmt.Fprintf(w, "%-44s %12s %12s\n", "  its serve CPU per call, toolgate / floor", us(bs.Total), us(bf.Total))
				fmt.Fprintf(w, "%-44s %12s %12s\n", "  of which nats-server", us(bs.Server), us(bf.Server))
				fmt.Fprintf(w, "%-44s %12s\n", "  of which its stages and runner", us(bs.Stages))
			case s.baselineProfileErr != nil:
				fmt.Fprintf(w, "baseline build's profiles: %v\n", s.baselineProfileErr)
			}
		}
		fmt.Fprintf(w, "(4) serve's user and system time from /proc over the profile's windows, per call ended in them: the measure of\n")
		fmt.Fprintf(w, "    the rounds above, read where the profile was taken\n")
		fmt.Fprintf(w, "(6) serve's CPU per call in the profile outside nats-server's code, less the same in the floor chain's profile\n")
		fmt.Fprintf(w, "    and the floor's hops in this process (the median round's): (2) without the server's CPU on either side, whose\n")
		fmt.Fprintf(w, "    store work moves with the disk between rounds by more than goal 4 itself. With both builds profiled, goal 4\n")
		fmt.Fprintf(w, "    is read here.\n")
		fmt.Fprintf(w, "(7) the profiles are taken in turns, two windows of %d s each: this build, its floor", s.ProfileSeconds/2)
		if len(s.Baseline) > 0 {
			fmt.Fprintf(w, ", the baseline build, its floor")
		}
		fmt.Fprintf(w, ", then the\n    same backwards, so that every profile centres on one moment and a drift of the disk favours none\n")
	}
}

// printModes writes each sync mode's rates beside the chains', with the
// ratios, and the store's writes and fsyncs per call.
func (s *Shipped) printModes(w io.Writer) {
	if len(s.Modes) == 0 {
		return
	}
	fmt.Fprintf(w, "\nsync modes, each its own serve (saturation: the median round's; unloaded: at the rate under --sync, where calls\n")
	fmt.Fprintf(w, "do not queue; the store's writes and fsyncs per call (8)):\n")
	fmt.Fprintf(w, "%-10s %-16s %11s %13s %13s %12s %12s %12s %8s\n", "--sync", "", "saturation", "unloaded p50", "unloaded p99",
		"file writes", "of them del.", "mem. writes", "fsyncs")
	row := func(mode, name string, sat, un Result, wr writesPerCall) {
		fsyncs := fmt.Sprintf("%.2f", wr.Fsyncs)
		if !wr.FsyncsCounted {
			fsyncs = fmt.Sprintf("%.2f d", wr.FsyncsDerived)
		}
		fmt.Fprintf(w, "%-10s %-16s %9.0f/s %13s %13s %12.2f %12.2f %12.2f %8s\n", mode, name, sat.Throughput(),
			ms(un.Quantile(0.5)), ms(un.Quantile(0.99)), wr.File, wr.Deletes, wr.Memory, fsyncs)
	}
	ratio := func(mode, name string, sat, un, satOf, unOf Result) {
		q := func(r, of Result, x float64) float64 {
			return float64(r.Quantile(x)) / max(float64(of.Quantile(x)), 1)
		}
		fmt.Fprintf(w, "%-10s %-16s %11.2f %13.2f %13.2f\n", mode, name, sat.Throughput()/max(satOf.Throughput(), 1e-9),
			q(un, unOf, 0.5), q(un, unOf, 0.99))
	}
	for _, m := range s.Modes {
		row(m.Sync, "toolgate", m.Toolgate, m.Unloaded, m.ToolgateWrites)
		row(fmt.Sprintf("(%d/s)", m.UnloadedRate), "floor", m.Floor, m.UnloadedFloor, m.FloorWrites)
		row("", "bare", m.Raw, m.UnloadedRaw, m.RawWrites)
		ratio("", "toolgate/floor", m.Toolgate, m.Unloaded, m.Floor, m.UnloadedFloor)
		ratio("", "toolgate/bare", m.Toolgate, m.Unloaded, m.Raw, m.UnloadedRaw)
	}
	for _, m := range s.Modes {
		// Wrapped at about the table's width.
		line := "toolgate's writes per call by stream, --sync " + m.Sync + ":"
		each := m.ToolgateWrites.streams()
		for i, st := range each {
			if i < len(each)-1 {
				st += ","
			}
			if len(line)+len(st) > 112 {
				fmt.Fprintln(w, line)
				line = "   "
			}
			line += " " + st
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintf(w, "(8) writes: per stream, the messages stored (a key-value write is one) and, in work-queue and interest streams,\n")
	fmt.Fprintf(w, "    those removed by an acknowledgement, each a tombstone record in the file store; from the server's stream\n")
	fmt.Fprintf(w, "    states before and after a saturation series (the first round's). fsyncs: serve's fsync and fdatasync calls in\n")
	fmt.Fprintf(w, "    that series, counted by perf; \"d\" where perf could not count: derived, one per file record with --sync always\n")
	fmt.Fprintf(w, "    (nats-server's file store fsyncs each record before it acknowledges it) and none with an interval\n")
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT MET"
}
