package bench

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/node"
)

// TestChainMakesThePipelinesWrites runs the bare chain with the pipeline's
// writes: every message comes through, and on the way it wrote its record
// three times and two events, as an invocation does.
func TestChainMakesThePipelinesWrites(t *testing.T) {
	nc := embeddedConn(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	chain, stop, err := rawChain(ctx, nc, 8, pipelineWrites)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	const n = 40
	res, err := chain.saturate(ctx, "writes", n, 4)
	if err != nil {
		t.Fatal(err)
	}
	if res.Done != n {
		t.Fatalf("%d of %d messages came through", res.Done, n)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, "BENCH_RAW_WRITES")
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Values() != n {
		t.Errorf("%d records, want %d", st.Values(), n)
	}
	// A creation and two compare-and-swaps per message.
	if writes := st.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq; writes != 3*n {
		t.Errorf("the records were written %d times, want %d", writes, 3*n)
	}
	stream, err := js.Stream(ctx, "BENCH_RAW_WRITES")
	if err != nil {
		t.Fatal(err)
	}
	for h, want := range map[int]uint64{3: n, 5: n} {
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(fmt.Sprintf("bench.rawwrites.event.%d", h)))
		if err != nil {
			t.Fatal(err)
		}
		if got := info.State.Subjects[fmt.Sprintf("bench.rawwrites.event.%d", h)]; got != want {
			t.Errorf("hop %d published %d events, want %d", h, got, want)
		}
		last, err := stream.GetLastMsgForSubject(ctx, fmt.Sprintf("bench.rawwrites.event.%d", h))
		if err != nil {
			t.Fatal(err)
		}
		if len(last.Data) != eventBytes {
			t.Errorf("hop %d published events of %d bytes, want the pipeline's %d", h, len(last.Data), eventBytes)
		}
	}
}

// TestLatenciesInTurns: a latency series taken in turns holds the calls of
// every turn, each target's latencies sorted; a rate too low for a call in
// every turn takes fewer turns, not none.
func TestLatenciesInTurns(t *testing.T) {
	nc := embeddedConn(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw, stopRaw, err := rawChain(ctx, nc, 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stopRaw()
	floor, stopFloor, err := rawChain(ctx, nc, 8, pipelineWrites)
	if err != nil {
		t.Fatal(err)
	}
	defer stopFloor()
	for _, c := range []struct {
		rate int
		d    time.Duration
		want int
	}{{50, time.Second, 50}, {2, time.Second, 2}} {
		res, err := latenciesInTurns(ctx, []*target{raw, floor}, []string{"raw", "floor"}, c.rate, c.d)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Sent != c.want || r.Done != c.want || len(r.Latencies) != c.want || !slices.IsSorted(r.Latencies) {
				t.Errorf("%d/s for %v, %s: %d sent, %d done, %d latencies (sorted: %v); want %d",
					c.rate, c.d, r.Name, r.Sent, r.Done, len(r.Latencies), slices.IsSorted(r.Latencies), c.want)
			}
		}
	}
}

// embeddedConn starts the embedded server on a free port, fsyncing every
// write with always, and connects to it; both end with t.
func embeddedConn(t *testing.T, always bool) *nats.Conn {
	t.Helper()
	ns, err := node.StartEmbedded(node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: t.TempDir(), SyncAlways: always})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
