package topology_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// TestStreamsHaveLimits: every stream has a byte and an age limit and
// refuses new messages when full rather than dropping stored ones; audit
// keeps 90 days by default, forever when asked.
func TestStreamsHaveLimits(t *testing.T) {
	for _, cfg := range topology.Streams(topology.TopologyOptions{}) {
		want := jetstream.DiscardNew
		if cfg.Name == subjects.StreamDeadLetter {
			// A full dead-letter stream must never stop audit ending calls.
			want = jetstream.DiscardOld
		}
		if cfg.MaxBytes <= 0 || cfg.MaxAge <= 0 || cfg.Discard != want {
			t.Errorf("%s: max_bytes %d, max_age %v, discard %v: want limits and %v", cfg.Name, cfg.MaxBytes, cfg.MaxAge, cfg.Discard, want)
		}
		if cfg.Name == subjects.StreamAudit && cfg.MaxAge != 90*24*time.Hour {
			t.Errorf("audit max age %v, want 90 days", cfg.MaxAge)
		}
	}
	for _, cfg := range topology.Streams(topology.TopologyOptions{AuditMaxAge: -1}) {
		if cfg.Name == subjects.StreamAudit && cfg.MaxAge != 0 {
			t.Errorf("audit max age %v with AuditMaxAge -1, want none", cfg.MaxAge)
		}
	}
}

// TestFullInvokeStreamRefusesPublisher: once the invoke stream holds its
// byte limit, a publish gets an error from JetStream (no ack), and what the
// stream holds stays.
func TestFullInvokeStreamRefusesPublisher(t *testing.T) {
	js := serverJS(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := topology.EnsureTopology(ctx, js, topology.TopologyOptions{InvokeMaxBytes: 4096}); err != nil {
		t.Fatal(err)
	}
	body := []byte(strings.Repeat("x", 500))
	acked := 0
	var refused error
	for i := range 100 {
		if _, err := js.Publish(ctx, subjects.Invoke("acme"), body, jetstream.WithMsgID(fmt.Sprint("inv-", i))); err != nil {
			refused = err
			break
		}
		acked++
	}
	if refused == nil {
		t.Fatal("100 publishes of 500 bytes into a 4 KiB invoke stream were all acknowledged")
	}
	var apiErr *jetstream.APIError
	if !errors.As(refused, &apiErr) || !strings.Contains(apiErr.Description, "maximum bytes") {
		t.Fatalf("publish to a full stream: %v, want a JetStream API error saying maximum bytes exceeded", refused)
	}
	st, err := js.Stream(ctx, subjects.StreamInvoke)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().State.Msgs; got != uint64(acked) {
		t.Fatalf("invoke stream holds %d messages after %d acknowledged publishes", got, acked)
	}
	t.Logf("%d publishes acknowledged, then: %v", acked, refused)
}

// TestAuditOutlastsOtherStagesDeliveries: audit ends nothing after it, so
// its consumers allow at least AuditMaxDeliver deliveries whatever
// MaxDeliver says; the other stages keep MaxDeliver.
func TestAuditOutlastsOtherStagesDeliveries(t *testing.T) {
	o := topology.TopologyOptions{MaxDeliver: 3}
	for _, stage := range subjects.Stages {
		for _, in := range subjects.Inputs(stage) {
			got := topology.ConsumerConfig(stage, in, o).MaxDeliver
			want := 3
			if stage == subjects.Audit {
				want = topology.AuditMaxDeliver
			}
			if got != want {
				t.Errorf("%s: max deliver %d, want %d", in.Consumer, got, want)
			}
		}
	}
}

// TestInvokeStreamHasNoDuplicateWindow: two tenants publishing the same
// Nats-Msg-Id at once both have their invocations stored, on a new
// topology and on one whose invoke stream was made with a window.
func TestInvokeStreamHasNoDuplicateWindow(t *testing.T) {
	for _, upgraded := range []bool{false, true} {
		t.Run(fmt.Sprintf("upgraded=%v", upgraded), func(t *testing.T) {
			js := serverJS(t, 0)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if upgraded {
				// What earlier versions made: a 100ms window over all tenants.
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: subjects.StreamInvoke, Subjects: []string{subjects.InvokeAll},
					Retention: jetstream.WorkQueuePolicy, Duplicates: 100 * time.Millisecond}); err != nil {
					t.Fatal(err)
				}
			}
			if err := topology.EnsureTopology(ctx, js, topology.TopologyOptions{}); err != nil {
				t.Fatal(err)
			}
			for _, tenant := range []string{"ta", "tb"} {
				ack, err := js.Publish(ctx, subjects.Invoke(tenant), []byte("{}"), jetstream.WithMsgID("same-msg-id"))
				if err != nil || ack.Duplicate {
					t.Fatalf("tenant %s: ack %+v, %v", tenant, ack, err)
				}
			}
			st, err := js.Stream(ctx, subjects.StreamInvoke)
			if err != nil {
				t.Fatal(err)
			}
			if info := st.CachedInfo(); info.State.Msgs != 2 || info.Config.Duplicates != 0 {
				t.Fatalf("invoke stream holds %d messages, window %v: want both tenants' and no window", info.State.Msgs, info.Config.Duplicates)
			}
		})
	}
}

// TestRedriveMemoryHops: with MemoryHops the hand-offs are in memory and the
// invoke stream keeps what validate took, so a server restart loses the
// hops but not the calls; Redrive hands validate again every invocation
// still held, and only those (an ended call's was deleted), while
// without MemoryHops it changes nothing.
func TestRedriveMemoryHops(t *testing.T) {
	dir := t.TempDir()
	start := func() *server.Server {
		ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
		if err != nil {
			t.Fatal(err)
		}
		ns.Start()
		if !ns.ReadyForConnections(10 * time.Second) {
			t.Fatal("server not ready")
		}
		return ns
	}
	ns := start()
	connect := func(ns *server.Server) jetstream.JetStream {
		nc, err := nats.Connect(ns.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, _ := jetstream.New(nc)
		return js
	}
	js := connect(ns)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := topology.TopologyOptions{MemoryHops: true}
	if err := topology.EnsureTopology(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	for _, cfg := range topology.Streams(o) {
		switch cfg.Name {
		case subjects.StreamPipeline:
			if cfg.Storage != jetstream.MemoryStorage || cfg.MaxBytes > topology.DefaultMemoryHopBytes {
				t.Errorf("%s on %v storage, %d bytes: want memory, at most %d", cfg.Name, cfg.Storage, cfg.MaxBytes, topology.DefaultMemoryHopBytes)
			}
		case subjects.StreamInvoke:
			if cfg.Retention != jetstream.LimitsPolicy || cfg.Storage != jetstream.FileStorage {
				t.Errorf("%s: %v retention on %v storage, want limits on file", cfg.Name, cfg.Retention, cfg.Storage)
			}
		default:
			if cfg.Storage != jetstream.FileStorage {
				t.Errorf("%s on %v storage, want file", cfg.Name, cfg.Storage)
			}
		}
	}
	for i := range 3 {
		if _, err := js.Publish(ctx, subjects.Invoke("ta"), fmt.Appendf(nil, "call %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.Publish(ctx, subjects.Pipe(subjects.Authorize, "normal", "ta"), []byte("hop")); err != nil {
		t.Fatal(err)
	}
	in := subjects.Inputs(subjects.Validate)[0]
	take := func(js jetstream.JetStream, want int) []string {
		t.Helper()
		c, err := js.Consumer(ctx, in.Stream, in.Consumer)
		if err != nil {
			t.Fatal(err)
		}
		batch, err := c.Fetch(10, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for m := range batch.Messages() {
			got = append(got, string(m.Data()))
			_ = m.Ack()
		}
		if len(got) != want {
			t.Fatalf("validate got %q, want %d messages", got, want)
		}
		return got
	}
	take(js, 3)
	// The first call ended: its ingest is deleted, as audit does.
	st, err := js.Stream(ctx, subjects.StreamInvoke)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(ctx, 1); err != nil {
		t.Fatal(err)
	}

	ns.Shutdown()
	ns.WaitForShutdown()
	ns = start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	js = connect(ns)
	if err := topology.EnsureTopology(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	pipe, err := js.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		t.Fatal(err)
	}
	if n := pipe.CachedInfo().State.Msgs; n != 0 {
		t.Fatalf("the pipeline in memory kept %d messages over the restart", n)
	}
	if ok, err := topology.Redrive(ctx, js); err != nil || !ok {
		t.Fatalf("Redrive: %v, %v", ok, err)
	}
	if got := take(js, 2); got[0] != "call 1" || got[1] != "call 2" {
		t.Fatalf("re-driven %q, want the two calls not ended", got)
	}

	// Without MemoryHops the invoke stream is a work queue: nothing to re-drive.
	js2 := connect(ns)
	for _, name := range []string{subjects.StreamInvoke, subjects.StreamPipeline, subjects.StreamRelay} {
		if err := js2.DeleteStream(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if err := topology.EnsureTopology(ctx, js2, topology.TopologyOptions{}); err != nil {
		t.Fatal(err)
	}
	if ok, err := topology.Redrive(ctx, js2); err != nil || ok {
		t.Fatalf("Redrive on a work queue: %v, %v", ok, err)
	}
}
