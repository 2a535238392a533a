package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/subjects"
)

// Scale is the throughput of a 50 ms tool with a number of execute workers.
type Scale struct {
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
	var out []Scale
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

func measureSlow(ctx context.Context, url string, o Options, cred credentials, name string) (Result, error) {
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
	req := api.Request{ToolID: "sleep", Parameters: json.RawMessage(fmt.Sprintf(`{"ms":%d}`, slowToolMS)), CapabilityToken: cred.token,
		AgentContext: api.AgentContext{AgentDID: benchAgent, TenantID: benchTenant}}
	publish := func(i int) (string, error) {
		id := fmt.Sprintf("scale-%d-%d", o.Rate, i)
		_, err := c.Invoke(ctx, req, client.InvokeOptions{ID: id})
		return id, err
	}
	return drive(ctx, o, name, col, publish)
}

func printScaling(w io.Writer, s []Scale) {
	fmt.Fprintf(w, "\nhorizontal scaling: a 50 ms tool, execute runners with one worker each (own connection), the other stages fixed\n")
	fmt.Fprintf(w, "%-26s %7s %7s %9s %9s %9s\n", "series", "offered", "done", "inv/s", "p50", "p99")
	for _, x := range s {
		r := x.Result
		fmt.Fprintf(w, "%-26s %7d %7d %9.1f %9s %9s\n", r.Name, r.Sent, r.Done, r.Throughput(), ms(r.Quantile(0.5)), ms(r.Quantile(0.99)))
	}
}
