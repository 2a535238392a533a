package runner

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/subjects"
)

// The ingests of calls that end apart are deleted together, oldest first,
// once the first has waited ingestLinger; those queued when the Runner
// stops are still deleted, oldest first too.
func TestDeleteIngestsInBatches(t *testing.T) {
	nc, js := natstest.JetStream(t)
	ctx := t.Context()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: subjects.StreamInvoke,
		Subjects: []string{subjects.InvokeAll}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	for range 6 {
		if _, err := js.Publish(ctx, subjects.Invoke("t1"), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	// The deletes as the server receives them (the JetStream API answers
	// them as ever).
	type seen struct {
		seq uint64
		at  time.Time
	}
	var mu sync.Mutex
	var deletes []seen
	sub, err := nc.Subscribe(subjects.MsgDelete(subjects.StreamInvoke), func(m *nats.Msg) {
		var req struct{ Seq uint64 }
		_ = json.Unmarshal(m.Data, &req)
		mu.Lock()
		deletes = append(deletes, seen{req.Seq, time.Now()})
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	snapshot := func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(deletes)
	}

	r := &Runner{JS: js, Log: slog.New(slog.DiscardHandler), ingest: make(chan uint64, 16)}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.deleteIngests(runCtx) }()

	start := time.Now()
	r.ingest <- 3
	r.ingest <- 1
	time.Sleep(ingestLinger / 4)
	r.ingest <- 5
	natstest.Eventually(t, 10*time.Second, func() bool { return len(snapshot()) == 3 }, "three deletes")
	got := snapshot()
	if first := got[0].at.Sub(start); first < ingestLinger {
		t.Errorf("the first delete went %v after its call ended, before the batch's %v", first, ingestLinger)
	}
	var seqs []uint64
	for _, d := range got {
		seqs = append(seqs, d.seq)
	}
	if !slices.Equal(seqs, []uint64{1, 3, 5}) {
		t.Errorf("deletes sent in the order %v, want one batch, oldest first: [1 3 5]", seqs)
	}

	// Queued as the Runner stops: deleted all the same, oldest first.
	r.ingest <- 4
	r.ingest <- 2
	stop()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("deleteIngests did not return once stopped")
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("stream holds %d messages, want 1 left (6)", info.State.Msgs)
	}
	if _, err := stream.GetMsg(ctx, 6); err != nil {
		t.Errorf("message 6, never queued, is gone: %v", err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return len(snapshot()) == 5 }, "five deletes")
	if late := snapshot()[3:]; late[0].seq != 2 || late[1].seq != 4 {
		t.Errorf("deletes queued at the stop sent in the order %d, %d; want oldest first: 2, 4", late[0].seq, late[1].seq)
	}
}
