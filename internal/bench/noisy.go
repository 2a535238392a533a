package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/subjects"
)

// Noisy is the noisy-neighbour series: a victim tenant's no-op latency
// alone, then while another tenant has a backlog of slow calls queued,
// with the per-tenant in-flight quota and without it.
type Noisy struct {
	Backlog  int           // the noisy tenant's queued calls
	Slow     time.Duration // each of them sleeps this long
	Unloaded Result
	Loaded   Result // noisy backlog, quota on (the default)
	NoQuota  Result // noisy backlog, --tenant-inflight -1
}

const (
	victimTenant  = "victim"
	noisyTenant   = "noisy"
	noisyBacklog  = 200
	noisySlow     = 200 * time.Millisecond
	victimRate    = 20 // no-ops per second
	victimPeriod  = 5 * time.Second
	noisyDrainMax = 2 * time.Minute
)

// RunNoisy measures only the noisy-neighbour series, on its own embedded
// server.
func RunNoisy(ctx context.Context, o Options) (Noisy, error) {
	o.Workers = max(o.Workers, 1)
	dir, err := os.MkdirTemp("", "toolgate-bench-noisy-")
	if err != nil {
		return Noisy{}, err
	}
	defer os.RemoveAll(dir)
	ns, err := node.StartEmbedded(node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: dir})
	if err != nil {
		return Noisy{}, err
	}
	defer ns.Shutdown()
	cred, err := newCredentials()
	if err != nil {
		return Noisy{}, err
	}
	return measureNoisy(ctx, ns.ClientURL(), o, cred)
}

func measureNoisy(ctx context.Context, url string, o Options, cred credentials) (Noisy, error) {
	out := Noisy{Backlog: noisyBacklog, Slow: noisySlow}
	var err error
	series := []struct {
		res      *Result
		name     string
		inflight int
		backlog  int
	}{
		{&out.Unloaded, "victim alone", 0, 0},
		{&out.Loaded, "victim, noisy backlog", 0, noisyBacklog},
		{&out.NoQuota, "victim, backlog, no quota", -1, noisyBacklog},
	}
	for i, s := range series {
		if *s.res, err = noisySeries(ctx, url, o, cred, i, s.name, s.inflight, s.backlog); err != nil {
			return out, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return out, nil
}

// noisySeries starts a node with the given quota, queues backlog slow calls
// of the noisy tenant, offers the victim's no-ops, and waits for both to end.
func noisySeries(ctx context.Context, url string, o Options, cred credentials, series int, name string, inflight, backlog int) (Result, error) {
	runCtx, stop := context.WithCancel(ctx)
	ready := make(chan struct{}, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- node.Run(runCtx, node.Config{
			NATSURL: url, Workers: o.Workers, Examples: true, TenantInFlight: inflight,
			Stage: node.StageConfig{Tokens: cred.verifier},
			Log:   discardLogger(),
			Ready: func(string, *node.Node) { ready <- struct{}{} },
		})
	}()
	defer func() { stop(); <-errc }()
	select {
	case <-ready:
	case err := <-errc:
		return Result{}, err
	}
	nc, err := nats.Connect(url)
	if err != nil {
		return Result{}, err
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		return Result{}, err
	}
	victimTok, err := cred.tokenFor(victimTenant)
	if err != nil {
		return Result{}, err
	}
	noisyTok, err := cred.tokenFor(noisyTenant)
	if err != nil {
		return Result{}, err
	}
	total := int(float64(victimRate)*victimPeriod.Seconds()) + warmup
	col := newCollector(total)
	noisyDone := newCollector(backlog)
	sub, err := nc.Subscribe(subjects.ResultTenant(victimTenant), func(m *nats.Msg) {
		if resp, err := client.DecodeResult(m.Data); err == nil && resp.Status == api.StatusSuccess {
			col.mark(resp.InvocationID)
		}
	})
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	nsub, err := nc.Subscribe(subjects.ResultTenant(noisyTenant), func(m *nats.Msg) {
		if resp, err := client.DecodeResult(m.Data); err == nil && resp.Status != api.StatusPending {
			noisyDone.mark(resp.InvocationID)
		}
	})
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = nsub.Unsubscribe() }()

	victim := api.Request{ToolID: "noop", Parameters: json.RawMessage(`{}`), CapabilityToken: victimTok,
		AgentContext: api.AgentContext{AgentDID: benchAgent, TenantID: victimTenant}}
	publish := func(i int) (string, error) {
		id := fmt.Sprintf("%s-%d-%d", victimTenant, series, i)
		_, err := c.Invoke(ctx, victim, client.InvokeOptions{ID: id})
		return id, err
	}
	if err := warm(ctx, publish); err != nil {
		return Result{}, err
	}
	slow := api.Request{ToolID: "sleep", Parameters: json.RawMessage(fmt.Sprintf(`{"ms":%d}`, noisySlow.Milliseconds())),
		CapabilityToken: noisyTok, AgentContext: api.AgentContext{AgentDID: benchAgent, TenantID: noisyTenant}}
	for i := range backlog {
		if _, err := c.Invoke(ctx, slow, client.InvokeOptions{ID: fmt.Sprintf("%s-%d-%d", noisyTenant, series, i)}); err != nil {
			return Result{}, err
		}
	}
	// The victim is measured against a backlog queued at execute, as in
	// the attack: wait until the stages before it have passed it on.
	if err := drained(ctx, nc, subjects.Route); err != nil {
		return Result{}, err
	}
	start := time.Now()
	due, sent, err := offer(ctx, victimRate, victimPeriod, func(i int) (string, error) { return publish(i + warmup) })
	if err != nil {
		return Result{}, err
	}
	col.wait(ctx, noisyDrainMax)
	res := col.result(name, due, sent, start)
	if backlog > 0 {
		noisyDone.wait(ctx, noisyDrainMax) // the next series starts without this backlog
	}
	return res, nil
}

// drained waits until stage's consumers hold no message.
func drained(ctx context.Context, nc *nats.Conn, stage string) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(noisyDrainMax)
	for time.Now().Before(deadline) {
		busy := false
		for _, in := range subjects.Inputs(stage) {
			ci, err := js.Consumer(ctx, in.Stream, in.Consumer)
			if err != nil {
				return err
			}
			info, err := ci.Info(ctx)
			if err != nil {
				return err
			}
			busy = busy || info.NumPending > 0 || info.NumAckPending > 0
		}
		if !busy {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not drain in %s", stage, noisyDrainMax)
}

// Print writes the series with the victim's loaded/unloaded ratios.
func (n Noisy) Print(w io.Writer) {
	fmt.Fprintf(w, "\nnoisy neighbour: %d queued %s calls of another tenant; the victim offers %d no-ops/s\n",
		n.Backlog, n.Slow, victimRate)
	fmt.Fprintf(w, "%-28s %7s %7s %9s %9s %9s %11s %11s\n", "series", "sent", "done", "p50", "p99", "max", "p50/alone", "p99/alone")
	for _, s := range []Result{n.Unloaded, n.Loaded, n.NoQuota} {
		fmt.Fprintf(w, "%-28s %7d %7d %9s %9s %9s %11.2f %11.2f\n", s.Name, s.Sent, s.Done,
			ms(s.Quantile(0.5)), ms(s.Quantile(0.99)), ms(s.Quantile(1)),
			float64(s.Quantile(0.5))/float64(max(n.Unloaded.Quantile(0.5), 1)),
			float64(s.Quantile(0.99))/float64(max(n.Unloaded.Quantile(0.99), 1)))
	}
}
