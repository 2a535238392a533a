package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// TestFlatnessAndSoak runs the flatness series small: every call spread
// over many tenants and over many registered tools completes, and the
// registered copies are gone afterwards; then a short soak.
func TestFlatnessAndSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the pipeline")
	}
	ns, err := node.StartEmbedded(node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cred, err := newCredentials()
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ready := make(chan *node.Node, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- node.Run(runCtx, node.Config{NATSURL: ns.ClientURL(), Workers: 4, Examples: true,
			Stage: node.StageConfig{Tokens: cred.verifier}, Log: discardLogger(),
			Ready: func(_ string, n *node.Node) { ready <- n }})
	}()
	defer func() { stop(); <-errc }()
	var n *node.Node
	select {
	case n = <-ready:
	case err := <-errc:
		t.Fatal(err)
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const many = 50
	fs, err := measureFlatness(ctx, nc, n, Options{SaturationN: 100}, cred, many)
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 2 {
		t.Fatalf("%d series, want 2", len(fs))
	}
	for _, f := range fs {
		for _, r := range []Result{f.Base, f.Many} {
			if r.Sent != 100 || r.Done != r.Sent {
				t.Errorf("%s / %s: %d of %d calls completed", f.Name, r.Name, r.Done, r.Sent)
			}
		}
	}
	for i := range many {
		if id := fmt.Sprintf("flat.noop%05d", i); n.Registry.Has(id, "1.0.0") {
			t.Errorf("%s is still registered", id)
		}
	}
	printFlatness(os.Stdout, fs)

	// The soak series on the same pipeline, short: every call completes,
	// the readings are taken the promised number of times, and the
	// retained set they report includes the soak's own results (kept by
	// the default retention here).
	base, stopBase, err := spreadTarget(nc, cred, 1, []string{"noop"})
	if err != nil {
		t.Fatal(err)
	}
	defer stopBase()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := base.soak(ctx, js, 40, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if s.Result.Sent != 80 || s.Result.Done != s.Result.Sent {
		t.Errorf("soak: %d of %d calls completed", s.Result.Done, s.Result.Sent)
	}
	if len(s.Samples) != soakSamples {
		t.Fatalf("soak: %d samples, want %d", len(s.Samples), soakSamples)
	}
	for i, x := range s.Samples {
		if x.RSS <= 0 || x.Heap <= 0 || x.Goroutines <= 0 || x.Messages == 0 || x.Subjects == 0 {
			t.Errorf("soak: sample %d is %+v, want every figure read", i, x)
		}
	}
	if last := s.Samples[soakSamples-1]; last.Messages <= s.Samples[0].Messages {
		t.Errorf("soak: retained messages %d at the start, %d at the end: the soak's results are not counted", s.Samples[0].Messages, last.Messages)
	}
	for q := range 4 {
		if s.PeakHeap[q] <= 0 || s.PeakRSS[q] <= 0 {
			t.Errorf("soak: quarter %d has no peak (heap %v, RSS %v)", q, s.PeakHeap, s.PeakRSS)
		}
	}
	s.Print(os.Stdout)
}

// TestSoakRetention: the soak's pipeline keeps results, audit events and
// status records for its bounded retention, not the defaults', so that what
// it retains reaches a steady state early in the run.
func TestSoakRetention(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the pipeline")
	}
	const soakFor = 10 * time.Minute
	want := SoakRetention(soakFor)
	if want != time.Minute {
		t.Errorf("a 10-minute soak keeps its set %v, want 1m", want)
	}
	ns, err := node.StartEmbedded(node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	n, err := node.OpenConn(ctx, nc, SoakTopology(soakFor), discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{subjects.StreamResults, subjects.StreamAudit} {
		st, err := n.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.CachedInfo().Config.MaxAge; got != want {
			t.Errorf("%s keeps messages %v, want %v", name, got, want)
		}
		if got := st.CachedInfo().Config.Duplicates; got != soakDuplicates {
			t.Errorf("%s's duplicate window is %v, want %v", name, got, soakDuplicates)
		}
	}
	kv, err := n.JS.KeyValue(ctx, kvstore.BucketInvocations)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != want {
		t.Errorf("status records are kept %v, want %v", st.TTL(), want)
	}
}
