package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/cputime"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/subjects"
)

// target is something invocations are offered to: toolgate's pipeline or
// the bare chain. Its completions are marked on the current collector, so
// one target serves several series in a row.
type target struct {
	name    string
	cur     atomic.Pointer[collector]
	publish func(ctx context.Context, key string, i int) error
	done    atomic.Int64 // calls that came back, of every series
}

func (t *target) mark(key string) {
	t.done.Add(1)
	if c := t.cur.Load(); c != nil {
		c.mark(key)
	}
}

// latencyAt offers rate/s for d after a warm-up and returns the series.
func (t *target) latencyAt(ctx context.Context, name string, rate int, d time.Duration) (Result, error) {
	prefix := fmt.Sprintf("%s-%d-", name, time.Now().UnixNano())
	n := int(float64(rate)*d.Seconds()) + warmup
	col := newCollector(n)
	col.prefix = prefix
	t.cur.Store(col)
	defer t.cur.Store(nil)
	publish := func(i int) (string, error) {
		key := prefix + strconv.Itoa(i)
		return key, t.publishRetried(ctx, key, i)
	}
	o := Options{Rate: rate, Duration: d}
	res, err := drive(ctx, o, name, col, publish)
	return res, err
}

// saturate offers n invocations as fast as conc publishers can and
// returns the completion rate: completions over the time from the first
// publish to the last completion.
func (t *target) saturate(ctx context.Context, name string, n, conc int) (Result, error) {
	prefix := fmt.Sprintf("%s-sat-%d-", name, time.Now().UnixNano())
	col := newCollector(n)
	col.prefix = prefix
	t.cur.Store(col)
	defer t.cur.Store(nil)
	due := make([]time.Time, n)
	cpu0 := cputime.Process()
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, conc)
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				due[i] = time.Now()
				if err := t.publishRetried(ctx, prefix+strconv.Itoa(i), i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return Result{}, err
	}
	// Until all are done, so that no backlog is left to the next series.
	col.wait(ctx, 5*time.Minute)
	m := make(map[string]time.Time, n)
	for i, at := range due {
		m[prefix+strconv.Itoa(i)] = at
	}
	r := col.result(name, m, n, start)
	if r.Done > 0 {
		r.CPUPerCall = (cputime.Process() - cpu0) / time.Duration(r.Done)
	}
	return r, nil
}

// publishRetried is t.publish, tried again (at most twice more) when its
// acknowledgement did not come in time: every publish carries a message
// id, so a publish that did land is not stored twice. On a loaded machine
// an fsync per write can hold acknowledgements back for seconds.
func (t *target) publishRetried(ctx context.Context, key string, i int) error {
	var err error
	for range 3 {
		if err = t.publish(ctx, key, i); err == nil || ctx.Err() != nil ||
			!(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) {
			return err
		}
	}
	return err
}

// hopWrites are the durable writes a hop makes besides its hand-off: a
// compare-and-swap of the message's record (the first hop creates it) and
// extra events published beside the hand-off.
type hopWrites struct {
	record bool
	events int
}

// pipelineWrites is toolgate's shape on the bare chain: validate claims the
// invocation's record, execute marks it running and publishes tool.invoked,
// audit writes the terminal status and publishes the audit event beside the
// result. With the ingest publish and the six hand-offs (the last is the
// result) that is the twelve writes an invocation costs, the figure the
// pipeline cannot go below without giving up a guarantee.
var pipelineWrites = []hopWrites{0: {record: true}, 3: {record: true, events: 1}, 5: {record: true, events: 1}}

// rawChain starts six bare hops on a work-queue stream: each hop publishes
// its input to the next asynchronously and acks it once the publish is
// acknowledged, with up to inflight messages pending per hop. With writes
// (indexed by hop), a hop also makes those writes before it acks, as the
// pipeline's stages do, and nothing else of theirs.
func rawChain(ctx context.Context, nc *nats.Conn, inflight int, writes []hopWrites) (*target, func(), error) {
	const hops = 6
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4*inflight))
	if err != nil {
		return nil, nil, err
	}
	name, prefix := "BENCH_RAW", "bench.raw"
	if writes != nil {
		name, prefix = "BENCH_RAW_WRITES", "bench.rawwrites"
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".>"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage})
	if err != nil {
		return nil, nil, err
	}
	var records jetstream.KeyValue
	if writes != nil {
		if records, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name, Storage: jetstream.FileStorage}); err != nil {
			_ = js.DeleteStream(ctx, name)
			return nil, nil, err
		}
	}
	hopCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t := &target{name: fmt.Sprintf("bare JetStream hop x%d", hops)}
	if writes != nil {
		t.name += ", toolgate's writes"
	}
	sub, err := nc.Subscribe(fmt.Sprintf("%s.%d", prefix, hops), func(m *nats.Msg) { t.mark(string(msgKey(m.Data))) })
	if err != nil {
		stop()
		return nil, nil, err
	}
	cleanup := func() {
		stop()
		wg.Wait()
		_ = sub.Unsubscribe()
		_ = js.DeleteStream(context.Background(), name)
		if records != nil {
			_ = js.DeleteKeyValue(context.Background(), name)
		}
	}
	// The record's revision per message, as the stores remember their own
	// writes: a compare-and-swap without a read.
	var revs sync.Map
	record := bytes.Repeat([]byte("r"), recordBytes)
	for h := range hops {
		var w hopWrites
		if h < len(writes) {
			w = writes[h]
		}
		cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: fmt.Sprintf("hop%d", h), FilterSubject: fmt.Sprintf("%s.%d", prefix, h),
			AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000,
		})
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		it, err := cons.Messages(jetstream.PullMaxMessages(inflight))
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		context.AfterFunc(hopCtx, it.Stop)
		next := fmt.Sprintf("%s.%d", prefix, h+1)
		event := fmt.Sprintf("%s.event.%d", prefix, h)
		slots := make(chan struct{}, inflight)
		// out is what the hop hands on: its input, or with the pipeline's
		// writes a message of the pipeline's size there.
		out := func(in []byte) []byte { return in }
		if writes != nil {
			size := handoffBytes
			if h == hops-1 {
				size = resultBytes
			}
			out = func(in []byte) []byte { return sized(in, size) }
		}
		// writeRecord makes the hop's compare-and-swap of the message's
		// record; a redelivery reads the record's revision first, as a store
		// whose write was refused does.
		writeRecord := func(key string, redelivered bool) error {
			if !w.record {
				return nil
			}
			rev, _ := revs.Load(key)
			r, _ := rev.(uint64)
			if redelivered {
				e, err := records.Get(hopCtx, key)
				switch {
				case errors.Is(err, jetstream.ErrKeyNotFound) && h == 0:
				case err != nil:
					return err
				default:
					r = e.Revision()
				}
			}
			if h == 0 && r == 0 {
				rev, err := records.Create(hopCtx, key, record)
				revs.Store(key, rev)
				return err
			}
			next, err := records.Update(hopCtx, key, record, r)
			if h == hops-1 {
				revs.Delete(key)
			} else {
				revs.Store(key, next)
			}
			return err
		}
		wg.Go(func() {
			for {
				m, err := it.Next()
				if err != nil {
					return
				}
				md, _ := m.Metadata()
				id := fmt.Sprintf("%d.%d", md.Sequence.Stream, h)
				publish := func() ([]jetstream.PubAckFuture, error) {
					fs := make([]jetstream.PubAckFuture, 0, 1+w.events)
					for e := range w.events {
						f, err := js.PublishMsgAsync(&nats.Msg{Subject: event, Data: sized(m.Data(), eventBytes)}, jetstream.WithMsgID(fmt.Sprintf("%s.e%d", id, e)))
						if err != nil {
							return nil, err
						}
						fs = append(fs, f)
					}
					f, err := js.PublishMsgAsync(&nats.Msg{Subject: next, Data: out(m.Data()), Header: nats.Header{}}, jetstream.WithMsgID(id))
					return append(fs, f), err
				}
				var fs []jetstream.PubAckFuture
				if !w.record {
					if fs, err = publish(); err != nil {
						_ = m.Nak()
						continue
					}
				}
				slots <- struct{}{}
				wg.Go(func() {
					defer func() { <-slots }()
					if w.record {
						var err error
						if err = writeRecord(recordKey(msgKey(m.Data())), md != nil && md.NumDelivered > 1); err == nil {
							fs, err = publish()
						}
						if err != nil {
							_ = m.Nak()
							return
						}
					}
					for _, f := range fs {
						select {
						case <-f.Ok():
						case <-f.Err():
							_ = m.Nak()
							return
						case <-hopCtx.Done():
							return
						}
					}
					_ = m.Ack()
				})
			}
		})
	}
	t.publish = func(ctx context.Context, key string, _ int) error {
		data := []byte(key)
		if writes != nil {
			data = sized(data, ingestBytes)
		}
		_, err := js.Publish(ctx, prefix+".0", data, jetstream.WithMsgID(key))
		return err
	}
	return t, cleanup, nil
}

// The sizes of the pipeline's messages for the no-op tool (body and
// headers), which the chain with the pipeline's writes carries: the
// tool.invoke event, a hand-off, an audit event, the result and a status
// record.
const (
	ingestBytes  = 800
	handoffBytes = 1200
	eventBytes   = 860
	resultBytes  = 830
	recordBytes  = 470
)

var pad = bytes.Repeat([]byte("p"), handoffBytes)

// sized is a message of n bytes (or its key alone if longer) that carries
// msg's key, padded after a newline.
func sized(msg []byte, n int) []byte {
	key := msgKey(msg)
	out := make([]byte, 0, max(n, len(key)))
	out = append(append(out, key...), '\n')
	return append(out, pad[:max(n-len(out), 0)]...)
}

// msgKey is a chain message's key: all of it, or what comes before its
// padding.
func msgKey(data []byte) []byte {
	key, _, _ := bytes.Cut(data, []byte("\n"))
	return key
}

// recordKey is a message's record key: its key, hashed to the characters a
// KV key allows.
func recordKey(msg []byte) string {
	h := fnv.New64a()
	_, _ = h.Write(msg)
	return strconv.FormatUint(h.Sum64(), 16)
}

// pipelineTarget offers the no-op tool through toolgate with one token per
// session (budgets are the token tree's), with a max_calls budget no series
// reaches when budgets is set.
func pipelineTarget(ctx context.Context, nc *nats.Conn, cred credentials, sessions int, budgets bool) (*target, func(), error) {
	toks, err := sessionTokens(cred, sessions, budgets)
	if err != nil {
		return nil, nil, err
	}
	return targetWithTokens(nc, toks, budgets)
}

// sessionTokens mints one token per session, granting every tool to
// benchAgent of benchTenant.
func sessionTokens(cred credentials, sessions int, budgets bool) ([]string, error) {
	toks := make([]string, sessions)
	for i := range toks {
		cl := token.Claims{
			ToolID: token.Patterns{"*"}, TenantID: benchTenant, AgentDID: benchAgent,
			RegisteredClaims: jwt.RegisteredClaims{
				ID:     fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i),
				Issuer: benchIssuer, Audience: jwt.ClaimStrings{benchAudience},
				ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour)),
			},
		}
		if budgets {
			cl.Budget = &token.Budget{MaxCalls: 1 << 40}
		}
		var err error
		if toks[i], err = token.Mint(cred.key, cl); err != nil {
			return nil, err
		}
	}
	return toks, nil
}

// targetWithTokens offers the no-op tool over nc, session i%len(toks) with
// toks' token.
func targetWithTokens(nc *nats.Conn, toks []string, budgets bool) (*target, func(), error) {
	c, err := client.New(nc)
	if err != nil {
		return nil, nil, err
	}
	sessions := len(toks)
	name := fmt.Sprintf("toolgate, %d session", sessions)
	if sessions > 1 {
		name += "s"
	}
	if budgets {
		name += ", budgets"
	}
	t := &target{name: name}
	// Every session's token is the bench agent's: an agent reads its own
	// results only.
	sub, err := nc.Subscribe(subjects.ResultAgent(benchTenant, benchAgent), func(m *nats.Msg) {
		resp, err := client.DecodeResult(m.Data)
		if err == nil && resp.Status == api.StatusSuccess {
			t.mark(resp.InvocationID)
		}
	})
	if err != nil {
		return nil, nil, err
	}
	t.publish = func(ctx context.Context, key string, i int) error {
		s := i % sessions
		req := api.Request{ToolID: "noop", Parameters: json.RawMessage(`{}`), CapabilityToken: toks[s],
			AgentContext: api.AgentContext{AgentDID: benchAgent, TenantID: benchTenant, SessionID: "s" + strconv.Itoa(s)}}
		_, err := c.Invoke(ctx, req, client.InvokeOptions{ID: key})
		return err
	}
	return t, func() { _ = sub.Unsubscribe() }, nil
}

// Saturation is one target's saturation beside the bare chain's.
type Saturation struct {
	Pipeline, Raw Result
}

// Ratio is toolgate's saturation over the bare chain's.
func (s Saturation) Ratio() float64 { return s.Pipeline.Throughput() / max(s.Raw.Throughput(), 1e-9) }

// Goals are the figures the pipeline is held to, each next to its target.
type Goals struct {
	Saturation []Saturation
	// Unloaded and Half are latency series at a low rate and at half of
	// toolgate's own saturation, each with the bare chain at that rate.
	Unloaded, UnloadedRaw Result
	Half, HalfRaw         Result
	HalfRate              int
	// Floor is the bare chain making the pipeline's twelve writes per
	// invocation and nothing else (pipelineWrites), beside the bare chain:
	// what the goals' ratios would be with no stage doing any work.
	Floor                    Saturation
	UnloadedFloor, HalfFloor Result
	LoadAvg                  string
	RSSMiB                   float64 // resident set at the end of the saturation series
	// Flat is the per-invocation cost with many tools and tenants.
	Flat []Flatness
	// Soak is the long run at half saturation (Options.Soak).
	Soak *Soak
	// Console is the web console's cost at saturation.
	Console *ConsoleCost
}

// saturationN is how many invocations a saturation series offers.
const saturationN = 2000

// measureGoals measures the goals: saturation with 1000 sessions
// and with one, budgets off and on, beside the bare chain; latency unloaded
// and at half of toolgate's saturation beside the bare chain at that rate.
func measureGoals(ctx context.Context, nc *nats.Conn, o Options, cred credentials) (Goals, error) {
	var g Goals
	raw, stopRaw, err := rawChain(ctx, nc, 256, nil)
	if err != nil {
		return g, err
	}
	defer stopRaw()
	floor, stopFloor, err := rawChain(ctx, nc, 256, pipelineWrites)
	if err != nil {
		return g, err
	}
	defer stopFloor()
	n := o.SaturationN
	if n <= 0 {
		n = saturationN
	}
	const publishers = 64
	rawSat, err := raw.saturate(ctx, "raw", n, publishers)
	if err != nil {
		return g, err
	}
	floorSat, err := floor.saturate(ctx, "floor", n, publishers)
	if err != nil {
		return g, err
	}
	floorSat.Name = floor.name
	g.Floor = Saturation{Pipeline: floorSat, Raw: rawSat}
	lowest := 0.0
	for _, s := range []struct {
		sessions int
		budgets  bool
	}{{1000, false}, {1, false}, {1000, true}, {1, true}} {
		t, stop, err := pipelineTarget(ctx, nc, cred, s.sessions, s.budgets)
		if err != nil {
			return g, err
		}
		res, err := t.saturate(ctx, t.name, n, publishers)
		stop()
		if err != nil {
			return g, err
		}
		res.Name = t.name
		g.Saturation = append(g.Saturation, Saturation{Pipeline: res, Raw: rawSat})
		if tp := res.Throughput(); lowest == 0 || tp < lowest {
			lowest = tp
		}
	}
	g.RSSMiB = rssMiB()
	t, stop, err := pipelineTarget(ctx, nc, cred, 1000, false)
	if err != nil {
		return g, err
	}
	defer stop()
	cc, err := measureConsole(ctx, nc.ConnectedUrl(), t, n, publishers)
	if err != nil {
		return g, fmt.Errorf("console: %w", err)
	}
	g.Console = &cc
	const unloaded = 50
	d := min(o.Duration, 5*time.Second)
	if g.Unloaded, err = t.latencyAt(ctx, "toolgate unloaded", unloaded, d); err != nil {
		return g, err
	}
	if g.UnloadedRaw, err = raw.latencyAt(ctx, "raw unloaded", unloaded, d); err != nil {
		return g, err
	}
	if g.UnloadedFloor, err = floor.latencyAt(ctx, "floor unloaded", unloaded, d); err != nil {
		return g, err
	}
	g.HalfRate = max(int(lowest/2), 1)
	if g.Half, err = t.latencyAt(ctx, "toolgate at half", g.HalfRate, d); err != nil {
		return g, err
	}
	if g.HalfRaw, err = raw.latencyAt(ctx, "raw at half", g.HalfRate, d); err != nil {
		return g, err
	}
	if g.HalfFloor, err = floor.latencyAt(ctx, "floor at half", g.HalfRate, d); err != nil {
		return g, err
	}
	g.LoadAvg = loadAvg()
	if o.Soak > 0 {
		js, err := jetstream.New(nc)
		if err != nil {
			return g, err
		}
		s, err := t.soak(ctx, js, g.HalfRate, o.Soak)
		if err != nil {
			return g, fmt.Errorf("soak: %w", err)
		}
		s.Retention = SoakRetention(o.Soak)
		g.Soak = &s
	}
	return g, nil
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "n/a"
	}
	return strings.Join(f[:3], " ")
}

// rssMiB is this process's resident set (Linux), or the Go runtime's view
// of the memory it obtained elsewhere.
func rssMiB() float64 {
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
				return kb / 1024
			}
		}
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.Sys) / (1 << 20)
}

// Print writes the goals, each figure with its target and whether it is met.
func (g Goals) Print(w io.Writer) {
	fmt.Fprintf(w, "\nin-process goals (load average at the end %s; one process holds server, stages and load generator):\n", g.LoadAvg)
	fmt.Fprintf(w, "%-40s %12s %12s %8s %8s  %s\n", "figure", "toolgate", "bare", "ratio", "goal", "")
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT MET"
	}
	for _, s := range g.Saturation {
		r := s.Ratio()
		fmt.Fprintf(w, "%-40s %10.0f/s %10.0f/s %8.2f %8s  %s\n", "saturation, "+s.Pipeline.Name,
			s.Pipeline.Throughput(), s.Raw.Throughput(), r, ">=0.50", verdict(r >= 0.5))
	}
	for _, s := range g.Saturation {
		// Not a goal: where the saturation goes (the whole process's CPU
		// time per call, server and load generator included).
		fmt.Fprintf(w, "%-40s %10.0fµs %10.0fµs %8.2f\n", "CPU per call, "+s.Pipeline.Name,
			float64(s.Pipeline.CPUPerCall.Microseconds()), float64(s.Raw.CPUPerCall.Microseconds()),
			float64(s.Pipeline.CPUPerCall)/max(float64(s.Raw.CPUPerCall), 1))
	}
	lat := func(name string, a, b Result) {
		for _, q := range []struct {
			q    float64
			goal float64
			tag  string
		}{{0.5, 1.5, "p50"}, {0.99, 2, "p99"}} {
			x, y := a.Quantile(q.q), b.Quantile(q.q)
			r := float64(x) / max(float64(y), 1)
			fmt.Fprintf(w, "%-40s %12s %12s %8.2f %8s  %s\n", name+" "+q.tag, ms(x), ms(y), r,
				fmt.Sprintf("<=%.1f", q.goal), verdict(r <= q.goal))
		}
	}
	lat("latency unloaded (50/s)", g.Unloaded, g.UnloadedRaw)
	lat(fmt.Sprintf("latency at half saturation (%d/s)", g.HalfRate), g.Half, g.HalfRaw)
	g.printFloor(w)
	fmt.Fprintf(w, "%-40s %10.0fMiB\n", "RSS after the saturation series", g.RSSMiB)
	if g.Console != nil {
		g.Console.Print(w)
	}
	printFlatness(w, g.Flat)
	if g.Soak != nil {
		g.Soak.Print(w)
	}
}

// printFloor writes the goals' figures for the bare chain that makes the
// pipeline's writes and nothing else, each as a ratio to the bare chain:
// the best the pipeline's ratio could be were every stage free.
func (g Goals) printFloor(w io.Writer) {
	f := g.Floor
	if f.Pipeline.Done == 0 {
		return
	}
	fmt.Fprintf(w, "%s (no stage logic; not goals, the floor under them):\n", f.Pipeline.Name)
	fmt.Fprintf(w, "%-40s %10.0f/s %10.0f/s %8.2f\n", "  saturation", f.Pipeline.Throughput(), f.Raw.Throughput(), f.Ratio())
	fmt.Fprintf(w, "%-40s %10.0fµs %10.0fµs %8.2f\n", "  CPU per call",
		float64(f.Pipeline.CPUPerCall.Microseconds()), float64(f.Raw.CPUPerCall.Microseconds()),
		float64(f.Pipeline.CPUPerCall)/max(float64(f.Raw.CPUPerCall), 1))
	for _, s := range []struct {
		name   string
		a, b   Result
		q      float64
		suffix string
	}{
		{"  latency unloaded (50/s)", g.UnloadedFloor, g.UnloadedRaw, 0.5, "p50"},
		{"  latency unloaded (50/s)", g.UnloadedFloor, g.UnloadedRaw, 0.99, "p99"},
		{fmt.Sprintf("  latency at %d/s", g.HalfRate), g.HalfFloor, g.HalfRaw, 0.5, "p50"},
		{fmt.Sprintf("  latency at %d/s", g.HalfRate), g.HalfFloor, g.HalfRaw, 0.99, "p99"},
	} {
		x, y := s.a.Quantile(s.q), s.b.Quantile(s.q)
		fmt.Fprintf(w, "%-40s %12s %12s %8.2f\n", s.name+" "+s.suffix, ms(x), ms(y), float64(x)/max(float64(y), 1))
	}
}
