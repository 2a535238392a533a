package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/console"
	"github.com/toolgate/toolgate/subjects"
)

// ConsoleCost is what a web console costs the pipeline at saturation: the
// pipeline's saturation with a console following the audit trail and one
// browser's live audit view open, beside its saturation without, and how
// much of the trail the console took in while the pipeline ran flat out.
type ConsoleCost struct {
	// Without and With are the saturation series without and with the
	// console, each two half series run in the order without, with, with,
	// without, so a drift of the machine's load weighs on both alike.
	Without, With Result
	// AuditEvents counts the events the trail received during the series
	// with the console, in AuditElapsed (the series' time); Ingested counts
	// those the console took in, in IngestElapsed (from each series' start
	// until the console had read all the trail held); Streamed those sent
	// to the live view (a view that cannot keep up loses events rather
	// than slowing the rest).
	AuditEvents, Ingested, Streamed uint64
	AuditElapsed, IngestElapsed     time.Duration
}

// Ratio is the pipeline's saturation with the console over without.
func (c ConsoleCost) Ratio() float64 {
	return c.With.Throughput() / max(c.Without.Throughput(), 1e-9)
}

// IngestRatio is the console's ingest rate over the trail's event rate.
func (c ConsoleCost) IngestRatio() float64 {
	return rate(c.Ingested, c.IngestElapsed) / max(rate(c.AuditEvents, c.AuditElapsed), 1e-9)
}

func rate(n uint64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// Print writes the figures.
func (c ConsoleCost) Print(w io.Writer) {
	if c.With.Done == 0 {
		return
	}
	fmt.Fprintf(w, "web console following the audit trail, one live audit view open:\n")
	fmt.Fprintf(w, "%-40s %10.0f/s %10.0f/s %8.2f  %s\n", "  saturation with / without console",
		c.With.Throughput(), c.Without.Throughput(), c.Ratio(), "(1.00: no slowdown)")
	fmt.Fprintf(w, "%-40s %10.0f/s %10.0f/s %8.2f  %s\n", "  console ingest / audit events",
		rate(c.Ingested, c.IngestElapsed), rate(c.AuditEvents, c.AuditElapsed), c.IngestRatio(),
		fmt.Sprintf("(%d of %d events taken in, %d sent to the live view)", c.Ingested, c.AuditEvents, c.Streamed))
}

// sum is a and b as one series: their calls over their times.
func sum(name string, a, b Result) Result {
	return Result{Name: name, Sent: a.Sent + b.Sent, Done: a.Done + b.Done, Elapsed: a.Elapsed + b.Elapsed}
}

// measureConsole saturates t without a console, with one (twice), and
// without again, n/2 calls each. The console runs in this process, as
// `toolgate console` would beside the stages, on its own connection to
// url; its live view is read over HTTP as a browser reads it.
func measureConsole(ctx context.Context, url string, t *target, n, conc int) (ConsoleCost, error) {
	var c ConsoleCost
	nc, err := nats.Connect(url)
	if err != nil {
		return c, err
	}
	defer nc.Close()
	cl, err := client.New(nc)
	if err != nil {
		return c, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return c, err
	}
	links := make(chan string, 4)
	con, err := console.New(console.Config{Client: cl, OnLink: func(p string) {
		select {
		case links <- p:
		default:
		}
	}})
	if err != nil {
		return c, err
	}
	half := max(n/2, 1)
	series := func(name string) (Result, error) {
		r, err := t.saturate(ctx, name, half, conc)
		r.Name = name
		return r, err
	}
	a1, err := series("without console")
	if err != nil {
		return c, err
	}

	conCtx, stopConsole := context.WithCancel(ctx)
	defer stopConsole()
	runErr := make(chan error, 1)
	go func() { runErr <- con.Run(conCtx) }()
	srv := httptest.NewServer(con.Handler())
	defer srv.Close()
	con.AllowListen(srv.Listener.Addr().String())
	var streamed atomic.Uint64
	if err := liveView(conCtx, srv.URL, <-links, &streamed); err != nil {
		return c, fmt.Errorf("live view: %w", err)
	}
	auditSeq := func() (uint64, error) {
		st, err := js.Stream(ctx, subjects.StreamAudit)
		if err != nil {
			return 0, err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return 0, err
		}
		return info.State.LastSeq, nil
	}
	var with [2]Result
	for i := range with {
		// The console has read what the trail held before the series.
		if err := settled(ctx, con); err != nil {
			return c, err
		}
		seq0, err := auditSeq()
		if err != nil {
			return c, err
		}
		in0, s0, start := con.Ingested(), streamed.Load(), time.Now()
		if with[i], err = series("with console"); err != nil {
			return c, err
		}
		// Audit writes a call's last events beside its result: the trail
		// is read again once the console has caught up with it.
		events, took, err := caughtUp(ctx, con, auditSeq, seq0, in0, start)
		if err != nil {
			return c, err
		}
		c.AuditEvents += events
		c.Ingested += con.Ingested() - in0
		c.Streamed += streamed.Load() - s0
		c.AuditElapsed += with[i].Elapsed
		c.IngestElapsed += took
	}
	stopConsole()
	if err := <-runErr; err != nil {
		return c, fmt.Errorf("console: %w", err)
	}
	a2, err := series("without console")
	if err != nil {
		return c, err
	}
	c.Without = sum("without console", a1, a2)
	c.With = sum("with console", with[0], with[1])
	return c, nil
}

// settled waits until the console has read the trail's backlog and its
// count has rested for 200 ms: no series is running, so it has taken in
// all there is.
func settled(ctx context.Context, con *console.Server) error {
	last := con.Ingested()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		n := con.Ingested()
		if n == last && n > 0 {
			return nil
		}
		last = n
	}
}

// caughtUp waits until the console has taken in every event the trail
// received since seq0 (in0 events taken in then) and returns how many that
// was and how long after start the console had them all. It gives up
// after 30 s: a console that far behind does not keep up, and the figures
// say so.
func caughtUp(ctx context.Context, con *console.Server, auditSeq func() (uint64, error), seq0, in0 uint64, start time.Time) (uint64, time.Duration, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		seq, err := auditSeq()
		if err != nil {
			return 0, 0, err
		}
		if con.Ingested()-in0 >= seq-seq0 || time.Now().After(deadline) {
			return seq - seq0, time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// liveView signs in with the one-time link and keeps the live audit view
// open, counting the events it is sent, until ctx ends.
func liveView(ctx context.Context, base, link string, streamed *atomic.Uint64) error {
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+link, nil)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		return fmt.Errorf("sign-in: %s", resp.Status)
	}
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, base+"/audit/stream", nil)
	resp, err = hc.Do(req)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return fmt.Errorf("live view: %s", resp.Status)
	}
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if bytes.HasPrefix(sc.Bytes(), []byte("data: ")) {
				streamed.Add(1)
			}
		}
	}()
	return nil
}
