package runner

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// announcingStage announces one event to subject while it works, then
// blocks until release is closed (nil: returns at once).
type announcingStage struct {
	subject string
	release chan struct{}
	calls   atomic.Int32
}

func (s *announcingStage) Process(ctx context.Context, inv *envelope.Invocation) ([]stages.Output, error) {
	s.calls.Add(1)
	if err := stages.Announce(ctx, stages.Output{Subject: s.subject, MsgID: inv.ID + ".announced", Data: []byte(`{}`)}); err != nil {
		return nil, err
	}
	if s.release != nil {
		<-s.release
	}
	return nil, nil
}

// TestAnnounceIsStoredBeforeTheInputGoes: an announced event is stored
// while the stage still works (it does not wait for the stage's end), and
// an input whose announced publish was not stored is not acked: it comes
// back, and the redelivery announces again.
func TestAnnounceIsStoredBeforeTheInputGoes(t *testing.T) {
	_, js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := topology.EnsureTopology(ctx, js, topology.TopologyOptions{}); err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, st *announcingStage, inv envelope.Invocation) func() {
		data, _ := json.Marshal(inv)
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subjects.Pipe(subjects.Execute, subjects.PriorityNormal, inv.Tenant), Data: data}); err != nil {
			t.Fatal(err)
		}
		r := &Runner{Name: subjects.Execute, Stage: st, JS: js, AckWait: 2 * time.Second,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(rctx) }()
		return func() { stop(); <-done }
	}
	audit, err := js.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	pipeline, err := js.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("stored while the stage works, input acked after", func(t *testing.T) {
		subject := subjects.AuditEvent("acme", envelope.SubjectSuffix(api.TypeInvoked))
		st := &announcingStage{subject: subject, release: make(chan struct{})}
		stop := run(t, st, envelope.Invocation{ID: "inv-a", Tenant: "acme", Event: envelope.Event{Seq: 1}})
		defer stop()
		natstest.Eventually(t, 20*time.Second, func() bool {
			_, err := audit.GetLastMsgForSubject(ctx, subject)
			return err == nil
		}, "the announced event stored while the stage still works")
		close(st.release)
		natstest.Eventually(t, 20*time.Second, func() bool {
			_, err := pipeline.GetLastMsgForSubject(ctx, subjects.Pipe(subjects.Verify, subjects.PriorityNormal, "acme"))
			return err == nil
		}, "the hand-off to verify")
		natstest.Eventually(t, 20*time.Second, func() bool {
			_, err := pipeline.GetLastMsgForSubject(ctx, subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "acme"))
			return errors.Is(err, jetstream.ErrMsgNotFound)
		}, "the input acked")
		if n := st.calls.Load(); n != 1 {
			t.Fatalf("processed %d times, want once", n)
		}
	})

	t.Run("not stored: the input comes back", func(t *testing.T) {
		// No stream takes this subject: the publish is refused.
		st := &announcingStage{subject: "nowhere.announced"}
		stop := run(t, st, envelope.Invocation{ID: "inv-b", Tenant: "beta", Event: envelope.Event{Seq: 2}})
		defer stop()
		natstest.Eventually(t, 30*time.Second, func() bool { return st.calls.Load() >= 2 },
			"the input redelivered after its announced publish failed")
		if _, err := pipeline.GetLastMsgForSubject(ctx, subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "beta")); err != nil {
			t.Fatalf("the input left the work queue though its announced event was never stored: %v", err)
		}
	})
}
