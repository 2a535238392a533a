package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/subjects"
)

// Scale is one point of the scaling series: the throughput of the no-op
// tool with PerStage runners of every stage, or of a 50 ms tool with
// Executors execute runners and the other stages fixed.
type Scale struct {
	PerStage  int
	Executors int
	Result    Result
}

// slowToolMS is how long each call of the scaling series sleeps.
const slowToolMS = 50

// measureScaling runs the other five stages once and then, for 1, 2, 4 and 8
// execute runners (each with one worker and its own NATS connection, as a
// separate `toolgate stage execute --workers 1` process would have), offers
// calls of the sleep tool (50 ms) above what they can serve, and measures
// the throughput: it should grow with the runners, 20/s each.
func measureScaling(ctx context.Context, url string, o Options, cred credentials) ([]Scale, error) {
	out, err := measureNoopScaling(ctx, url, o, cred)
	if err != nil {
		return out, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	others := []string{subjects.Validate, subjects.Authorize, subjects.Route, subjects.Verify, subjects.Audit}
	errc := make(chan error, 9)
	running := 0
	start := func(stages []string, workers int) {
		running++
		go func() {
			errc <- node.Run(runCtx, node.Config{NATSURL: url, Stages: stages, Workers: workers,
				Stage: node.StageConfig{Tokens: cred.verifier}, Log: discardLogger()})
		}()
	}
	defer func() {
		stop()
		for range running {
			<-errc
		}
	}()
	start(others, o.Workers)
	for _, n := range []int{1, 2, 4, 8} {
		for running-1 < n { // running counts the other stages too
			start([]string{subjects.Execute}, 1)
		}
		so := o
		so.Rate = n * 1000 / slowToolMS * 5 / 4 // a quarter above capacity
		so.Duration = 5 * time.Second
		res, err := measureSlow(ctx, url, so, cred, fmt.Sprintf("sleep 50ms, %d execute", n))
		if err != nil {
			return out, err
		}
		out = append(out, Scale{Executors: n, Result: res})
	}
	return out, nil
}

// measureNoopScaling runs the no-op tool through the whole pipeline with one,
// then two processes of every stage (`toolgate stage NAME` with o.Workers
// workers, or with o.Binary unset runners in this process, each with its
// own NATS connection), offered at twice o.Rate per process: the
// per-message cost of the pipeline bounds it, and more processes per stage
// should raise it until the machine's cores are full.
func measureNoopScaling(ctx context.Context, url string, o Options, cred credentials) ([]Scale, error) {
	var out []Scale
	for _, per := range []int{1, 2} {
		res, err := func() (Result, error) {
			var stages []string
			for _, st := range subjects.Stages {
				for range per {
					stages = append(stages, st)
				}
			}
			stop, err := startStages(ctx, url, o, stages, cred)
			if err != nil {
				return Result{}, err
			}
			defer stop()
			so := o
			so.Rate = 2 * o.Rate * per
			so.Duration = 5 * time.Second
			name := fmt.Sprintf("no-op, %d per stage", per)
			if o.Binary != "" {
				name = fmt.Sprintf("no-op, %d proc per stage", per)
			}
			return measureNoop(ctx, url, so, cred, name)
		}()
		if err != nil {
			return out, err
		}
		out = append(out, Scale{PerStage: per, Result: res})
	}
	return out, nil
}

// startStages starts one worker group per entry of stages, as processes of
// o.Binary or as runners in this process, and returns once all are ready;
// stop ends them.
func startStages(ctx context.Context, url string, o Options, stages []string, cred credentials) (stop func(), err error) {
	if o.Binary != "" {
		dir := o.Dir
		if dir == "" {
			dir = os.TempDir()
		}
		p, err := startStageProcs(ctx, o.Binary, url, dir, stages, o.Workers, cred)
		if err != nil {
			return nil, err
		}
		return p.stop, nil
	}
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, len(stages))
	ready := make(chan struct{}, len(stages))
	running := 0
	stop = func() {
		cancel()
		for range running {
			<-errc
		}
	}
	for _, st := range stages {
		running++
		go func() {
			errc <- node.Run(runCtx, node.Config{NATSURL: url, Stages: []string{st}, Workers: o.Workers,
				Stage: node.StageConfig{Tokens: cred.verifier}, Log: discardLogger(),
				Ready: func(string, *node.Node) { ready <- struct{}{} }})
		}()
	}
	for range running { // measure the runners, not their start
		select {
		case <-ready:
		case err := <-errc:
			running--
			stop()
			return nil, fmt.Errorf("starting runners: %v", err)
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		}
	}
	return stop, nil
}

func measureSlow(ctx context.Context, url string, o Options, cred credentials, name string) (Result, error) {
	req := api.Request{ToolID: "sleep", Parameters: json.RawMessage(fmt.Sprintf(`{"ms":%d}`, slowToolMS)), CapabilityToken: cred.token,
		AgentContext: api.AgentContext{AgentDID: benchAgent, TenantID: benchTenant}}
	return measureTool(ctx, url, o, req, name)
}

func measureNoop(ctx context.Context, url string, o Options, cred credentials, name string) (Result, error) {
	req := api.Request{ToolID: "noop", Parameters: json.RawMessage(`{}`), CapabilityToken: cred.token,
		AgentContext: api.AgentContext{AgentDID: benchAgent, TenantID: benchTenant}}
	return measureTool(ctx, url, o, req, name)
}

// measureTool offers calls of req at o.Rate for o.Duration and measures
// their throughput and latency.
func measureTool(ctx context.Context, url string, o Options, req api.Request, name string) (Result, error) {
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
	publish := func(i int) (string, error) {
		id := fmt.Sprintf("scale-%s-%d-%d", req.ToolID, o.Rate, i)
		_, err := c.Invoke(ctx, req, client.InvokeOptions{ID: id})
		return id, err
	}
	return drive(ctx, o, name, col, publish)
}

func printScaling(w io.Writer, s []Scale) {
	fmt.Fprintf(w, "\nhorizontal scaling: the no-op tool with 1 and 2 processes per stage (toolgate stage; runners with their own\n"+
		"connection when run in-process), then a 50 ms tool\n"+
		"with execute runners of one worker each, the other stages fixed\n")
	fmt.Fprintf(w, "%-26s %7s %7s %9s %9s %9s\n", "series", "offered", "done", "inv/s", "p50", "p99")
	for _, x := range s {
		r := x.Result
		fmt.Fprintf(w, "%-26s %7d %7d %9.1f %9s %9s\n", r.Name, r.Sent, r.Done, r.Throughput(), ms(r.Quantile(0.5)), ms(r.Quantile(0.99)))
	}
}
