// Package bench measures toolgate end to end and, in the same run on the
// same server, the cost of a bare JetStream hop chained six times, so the
// pipeline's figures always come with the raw figure they should be judged
// against.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// Options configure a run.
type Options struct {
	// Rate is the offered load in invocations per second; keep it below
	// saturation so latencies are not queueing delays.
	Rate     int
	Duration time.Duration
	Workers  int
	// Dir holds the file storage; empty uses a temporary directory.
	Dir string
	// SaturationN is how many invocations each saturation series offers
	// (default 2000).
	SaturationN int
	// GoalsOnly measures the goals (saturation and latency beside the bare
	// chain) and nothing else.
	GoalsOnly bool
	// Soak, when set, runs the pipeline at half its saturation this long
	// and reports whether its resident set grows.
	Soak time.Duration
	// Binary is the toolgate executable: with it, the scaling series with
	// one and two processes per stage runs real `toolgate stage`
	// processes; without it, runners in this process, each on its own
	// connection.
	Binary string
	// ShippedOnly measures only the shipped series: `toolgate serve` from
	// Binary with its defaults, beside the chains on its server.
	ShippedOnly bool
	// ServeProfile, when set, is where a CPU profile of that serve process
	// under saturation load is written.
	ServeProfile string
	// ServeBinary, when set, is the toolgate executable whose serve the
	// shipped series measures (another build); Binary otherwise.
	ServeBinary string
	// BaselineBinary, when set, is a build whose serve the shipped series
	// measures in the same rounds, in turn with the one measured, with
	// --sync interval (the starting build: goal 4 halves its own CPU per
	// call).
	BaselineBinary string
	// ServeSync, when set, is the one --sync those serves are measured
	// with; by default they are measured with always (as shipped) and then
	// with interval, which takes the disk out of the figures, to compare
	// two builds' CPU where it, not the store, bounds them. What ships
	// fsyncs every write, so a run with another mode alone does not meet
	// goal 3.
	ServeSync string
}

// Result is one measured series.
type Result struct {
	Name       string
	Sent, Done int
	Elapsed    time.Duration
	Latencies  []time.Duration // sorted
	// CPUPerCall is the process's CPU time per completed call (saturation
	// series only).
	CPUPerCall time.Duration
}

// Throughput is completed invocations per second.
func (r Result) Throughput() float64 { return float64(r.Done) / r.Elapsed.Seconds() }

// Quantile returns the q-quantile latency.
func (r Result) Quantile(q float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	i := int(q * float64(len(r.Latencies)-1))
	return r.Latencies[i]
}

// Report is the outcome of Run.
type Report struct {
	Options   Options
	Pipeline  Result
	Raw       Result
	Detectors []DetectorCost
	Authz     []Cost
	Bus       []BusCost
	Sandbox   []Cost
	MCP       []Cost
	Noisy     *Noisy
	// Front is the MCP front end's cost over a direct tool.invoke.
	Front   []Cost
	Scaling []Scale
	// Sync is the publish rate with and without an fsync per write.
	Sync  []SyncCost
	Goals *Goals
	// Shipped is `toolgate serve` as its own process with its defaults
	// (Options.Binary): the figures the performance goals are held to.
	Shipped *Shipped
}

// Run starts an embedded server with file storage, measures a no-op builtin
// tool through all six stages at the offered load, then a bare six-hop
// JetStream chain at the same load, and returns both.
func Run(ctx context.Context, o Options) (Report, error) {
	if o.Rate <= 0 {
		o.Rate = 300
	}
	if o.Duration <= 0 {
		o.Duration = 10 * time.Second
	}
	if o.Workers <= 0 {
		o.Workers = 4
	}
	if o.Dir == "" {
		dir, err := os.MkdirTemp("", "toolgate-bench-")
		if err != nil {
			return Report{}, err
		}
		defer os.RemoveAll(dir)
		o.Dir = dir
	}
	rep := Report{Options: o}
	// The detectors come first, before the server starts: they run alone
	// in the process.
	if !o.ShippedOnly {
		rep.Detectors = measureDetectors()
	}
	// Then toolgate as shipped, its own process, while nothing else of
	// the bench runs.
	if o.Binary != "" {
		n := o.SaturationN
		if n <= 0 {
			n = saturationN
		}
		bin := o.Binary
		if o.ServeBinary != "" {
			bin = o.ServeBinary
		}
		s, err := measureShipped(ctx, bin, o.Dir, n, min(o.Duration, 5*time.Second), o.ServeProfile, o.BaselineBinary, o.ServeSync)
		if err != nil {
			return rep, fmt.Errorf("shipped: %w", err)
		}
		rep.Shipped = s
	}
	if o.ShippedOnly {
		return rep, nil
	}
	ns, err := node.StartEmbedded(node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: o.Dir})
	if err != nil {
		return rep, err
	}
	defer ns.Shutdown()
	url := ns.ClientURL()

	cred, err := newCredentials()
	if err != nil {
		return rep, err
	}
	// The connect costs come next, measured on a process not yet loaded
	// by the pipeline series.
	if !o.GoalsOnly {
		if rep.Bus, err = measureBus(ctx, url, o.Dir, cred); err != nil {
			return rep, fmt.Errorf("bus authentication: %w", err)
		}
	}
	if rep.Pipeline, rep.Authz, rep.Front, rep.Goals, err = measurePipeline(ctx, url, o, cred); err != nil {
		return rep, fmt.Errorf("pipeline: %w", err)
	}
	if o.GoalsOnly {
		return rep, nil
	}
	if rep.Raw, err = measureRaw(ctx, url, o); err != nil {
		return rep, fmt.Errorf("raw JetStream: %w", err)
	}
	noisy, err := measureNoisy(ctx, url, o, cred)
	if err != nil {
		return rep, fmt.Errorf("noisy neighbour: %w", err)
	}
	rep.Noisy = &noisy
	if rep.Scaling, err = measureScaling(ctx, url, o, cred); err != nil {
		return rep, fmt.Errorf("scaling: %w", err)
	}
	if rep.Sync, err = measureSync(ctx, o.Dir); err != nil {
		return rep, fmt.Errorf("store sync: %w", err)
	}
	if rep.Sandbox, err = measureSandbox(ctx); err != nil {
		return rep, fmt.Errorf("sandbox: %w", err)
	}
	if rep.MCP, err = MeasureMCP(ctx, MCPServersDir()); err != nil {
		return rep, fmt.Errorf("mcp: %w", err)
	}
	return rep, nil
}

// offer publishes n messages at rate and records, per key, when each was due.
// Latency is measured from the due time, so a stalled publisher cannot hide
// queueing (no coordinated omission).
func offer(ctx context.Context, rate int, d time.Duration, publish func(i int) (string, error)) (map[string]time.Time, int, error) {
	n := int(float64(rate) * d.Seconds())
	due := make(map[string]time.Time, n)
	start := time.Now()
	interval := time.Second / time.Duration(rate)
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if w := time.Until(at); w > 0 {
			time.Sleep(w)
		}
		if ctx.Err() != nil {
			return due, i, ctx.Err()
		}
		key, err := publish(i)
		if err != nil {
			return due, i, err
		}
		due[key] = at
	}
	return due, n, nil
}

// collector records completion times by key.
type collector struct {
	mu   sync.Mutex
	done map[string]time.Time
	all  chan struct{}
	want int
	// prefix, when set, is what every key of this series starts with:
	// completions of other series' calls (a straggler, or a target
	// subscribed to every result) are not counted.
	prefix string
	// sink, when set, takes every completion instead of the map, for runs
	// too long to keep one entry per call.
	sink func(key string, at time.Time)
}

func newCollector(want int) *collector {
	return &collector{done: make(map[string]time.Time, want), all: make(chan struct{}), want: want}
}

func (c *collector) mark(key string) {
	if !strings.HasPrefix(key, c.prefix) {
		return
	}
	now := time.Now()
	if c.sink != nil {
		c.sink(key, now)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.done[key]; ok {
		return
	}
	c.done[key] = now
	if len(c.done) == c.want {
		close(c.all)
	}
}

func (c *collector) result(name string, due map[string]time.Time, sent int, start time.Time) Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := Result{Name: name, Sent: sent}
	var last time.Time
	for k, at := range due {
		end, ok := c.done[k]
		if !ok {
			continue
		}
		r.Done++
		r.Latencies = append(r.Latencies, end.Sub(at))
		if end.After(last) {
			last = end
		}
	}
	r.Elapsed = last.Sub(start)
	slices.Sort(r.Latencies)
	return r
}

func (c *collector) wait(ctx context.Context, d time.Duration) {
	select {
	case <-c.all:
	case <-time.After(d):
	case <-ctx.Done():
	}
}

const (
	benchTenant = "bench"
	benchAgent  = "did:agent:bench"
)

func measurePipeline(ctx context.Context, url string, o Options, cred credentials) (Result, []Cost, []Cost, *Goals, error) {
	runCtx, stop := context.WithCancel(ctx)
	ready := make(chan *node.Node, 1)
	errc := make(chan error, 1)
	// A soak runs with the retention of a long-running deployment (every
	// series shares the streams, created here).
	var topo topology.TopologyOptions
	if o.Soak > 0 {
		topo = SoakTopology(o.Soak)
	}
	go func() {
		errc <- node.Run(runCtx, node.Config{
			NATSURL: url, Workers: o.Workers, Examples: true, Topology: topo,
			Stage: node.StageConfig{Tokens: cred.verifier},
			Log:   discardLogger(),
			Ready: func(_ string, n *node.Node) { ready <- n },
		})
	}()
	defer func() { stop(); <-errc }()
	var node *node.Node
	select {
	case node = <-ready:
	case err := <-errc:
		return Result{}, nil, nil, nil, err
	}
	nc, err := nats.Connect(url)
	if err != nil {
		return Result{}, nil, nil, nil, err
	}
	defer nc.Close()
	goals, err := measureGoals(ctx, nc, o, cred)
	if err != nil {
		return Result{}, nil, nil, nil, fmt.Errorf("goals: %w", err)
	}
	if goals.Flat, err = measureFlatness(ctx, nc, node, o, cred, flatMany); err != nil {
		return Result{}, nil, nil, &goals, fmt.Errorf("flatness: %w", err)
	}
	authz, err := measureAuthz(runCtx, node, cred)
	if err != nil {
		return Result{}, authz, nil, &goals, err
	}
	if o.GoalsOnly {
		return Result{}, authz, nil, &goals, nil
	}
	res, err := measureInvocations(ctx, url, o, cred)
	if err != nil {
		return res, nil, nil, &goals, err
	}
	front, err := measureFront(runCtx, url, cred)
	if err != nil {
		return res, authz, nil, &goals, fmt.Errorf("mcp front end: %w", err)
	}
	return res, authz, front, &goals, nil
}

func measureInvocations(ctx context.Context, url string, o Options, cred credentials) (Result, error) {

	nc, err := nats.Connect(url)
	if err != nil {
		return Result{}, err
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		return Result{}, err
	}
	total := int(float64(o.Rate)*o.Duration.Seconds()) + warmup
	col := newCollector(total)
	sub, err := nc.Subscribe(subjects.ResultTenant(benchTenant), func(m *nats.Msg) {
		resp, err := client.DecodeResult(m.Data)
		if err == nil && resp.Status == api.StatusSuccess {
			col.mark(resp.InvocationID)
		}
	})
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	req := api.Request{ToolID: "noop", Parameters: json.RawMessage(`{}`), CapabilityToken: cred.token,
		AgentContext: api.AgentContext{AgentDID: benchAgent, TenantID: benchTenant}}
	publish := func(i int) (string, error) {
		id := fmt.Sprintf("bench-%d", i)
		_, err := c.Invoke(ctx, req, client.InvokeOptions{ID: id})
		return id, err
	}
	return drive(ctx, o, "toolgate, 6 stages", col, publish)
}

const warmup = 50

func warm(ctx context.Context, publish func(int) (string, error)) error {
	for i := range warmup {
		if _, err := publish(i); err != nil {
			return err
		}
	}
	time.Sleep(500 * time.Millisecond)
	return ctx.Err()
}

// measureRaw chains six bare hops: each hop consumes from its subject on a
// work-queue stream, publishes to the next with a publish ack, then acks.
func measureRaw(ctx context.Context, url string, o Options) (Result, error) {
	const hops = 6
	nc, err := nats.Connect(url)
	if err != nil {
		return Result{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return Result{}, err
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_RAW", Subjects: []string{"bench.raw.>"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage})
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = js.DeleteStream(context.Background(), "BENCH_RAW") }()
	hopCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	for h := range hops {
		cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: fmt.Sprintf("hop%d", h), FilterSubject: fmt.Sprintf("bench.raw.%d", h),
			AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000,
		})
		if err != nil {
			return Result{}, err
		}
		it, err := cons.Messages(jetstream.PullMaxMessages(o.Workers))
		if err != nil {
			return Result{}, err
		}
		context.AfterFunc(hopCtx, it.Stop)
		next := fmt.Sprintf("bench.raw.%d", h+1)
		for range o.Workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					m, err := it.Next()
					if err != nil {
						return
					}
					md, _ := m.Metadata()
					out := &nats.Msg{Subject: next, Data: m.Data(), Header: nats.Header{}}
					if _, err := js.PublishMsg(hopCtx, out, jetstream.WithMsgID(fmt.Sprintf("%d.%d", md.Sequence.Stream, h))); err != nil {
						_ = m.Nak()
						continue
					}
					_ = m.Ack()
				}
			}()
		}
	}
	total := int(float64(o.Rate)*o.Duration.Seconds()) + warmup
	col := newCollector(total)
	// The last hop's output is read the way a caller reads a result.
	sub, err := nc.Subscribe(fmt.Sprintf("bench.raw.%d", hops), func(m *nats.Msg) { col.mark(string(m.Data)) })
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	publish := func(i int) (string, error) {
		key := fmt.Sprintf("raw-%d", i)
		_, err := js.Publish(ctx, "bench.raw.0", []byte(key), jetstream.WithMsgID(key))
		return key, err
	}
	return drive(ctx, o, fmt.Sprintf("bare JetStream hop x%d", hops), col, publish)
}

// drive warms up, offers the load through publish, and collects the series.
func drive(ctx context.Context, o Options, name string, col *collector, publish func(int) (string, error)) (Result, error) {
	if err := warm(ctx, publish); err != nil {
		return Result{}, err
	}
	start := time.Now()
	due, sent, err := offer(ctx, o.Rate, o.Duration, func(i int) (string, error) { return publish(i + warmup) })
	if err != nil {
		return Result{}, err
	}
	col.wait(ctx, 30*time.Second)
	return col.result(name, due, sent, start), nil
}

// Print writes the report as a table with the pipeline/raw ratios.
func (r Report) Print(w io.Writer) {
	fmt.Fprintf(w, "toolgate bench: %d CPU %s/%s, %s, file storage, offered %d/s for %v\n",
		runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), r.Options.Rate, r.Options.Duration)
	if r.Shipped != nil {
		r.Shipped.Print(w)
	}
	if r.Pipeline.Sent > 0 || r.Goals != nil {
		fmt.Fprintf(w, "\nin-process (one process holds the server, the stages and the load generator; unauthenticated bus, %d workers per stage):\n", r.Options.Workers)
	}
	if r.Pipeline.Sent > 0 {
		r.printSeries(w)
	}
	if r.Goals != nil {
		r.Goals.Print(w)
	}
	if r.Noisy != nil {
		r.Noisy.Print(w)
	}
	if len(r.Authz) > 0 {
		printAuthz(w, r.Authz)
	}
	if len(r.Bus) > 0 {
		printBus(w, r.Bus)
	}
	if len(r.Scaling) > 0 {
		printScaling(w, r.Scaling)
	}
	printSync(w, r.Sync)
	if len(r.Detectors) > 0 {
		printDetectors(w, r.Detectors)
	}
	if len(r.Sandbox) > 0 {
		printSandbox(w, r.Sandbox)
	}
	if len(r.MCP) > 0 {
		PrintMCP(w, r.MCP)
	}
	PrintFront(w, r.Front)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d.Microseconds())/1000) }

func (r Report) printSeries(w io.Writer) {
	fmt.Fprintf(w, "%-26s %7s %7s %9s %9s %9s %9s %9s\n", "series", "sent", "done", "inv/s", "p50", "p90", "p99", "max")
	for _, s := range []Result{r.Pipeline, r.Raw} {
		fmt.Fprintf(w, "%-26s %7d %7d %9.1f %9s %9s %9s %9s\n", s.Name, s.Sent, s.Done, s.Throughput(),
			ms(s.Quantile(0.5)), ms(s.Quantile(0.9)), ms(s.Quantile(0.99)), ms(s.Quantile(1)))
	}
	ratio := func(a, b time.Duration) float64 {
		if b == 0 {
			return 0
		}
		return float64(a) / float64(b)
	}
	fmt.Fprintf(w, "%-26s %7s %7s %9.2f %9.2f %9.2f %9.2f %9.2f\n", "ratio toolgate/raw", "", "",
		r.Pipeline.Throughput()/max(r.Raw.Throughput(), 1e-9),
		ratio(r.Pipeline.Quantile(0.5), r.Raw.Quantile(0.5)), ratio(r.Pipeline.Quantile(0.9), r.Raw.Quantile(0.9)),
		ratio(r.Pipeline.Quantile(0.99), r.Raw.Quantile(0.99)), ratio(r.Pipeline.Quantile(1), r.Raw.Quantile(1)))
}
