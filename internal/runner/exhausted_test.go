package runner

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// TestExhaustedMessageEndsAfterFailedAttempts: the max-deliveries advisory
// comes once, so a failed attempt to end the message (here the stream is
// not there yet, as during a leader election) is retried until the
// invocation is handed to audit and the message deleted.
func TestExhaustedMessageEndsAfterFailedAttempts(t *testing.T) {
	_, js := natstest.JetStream(t)
	r := &Runner{Name: subjects.Execute, JS: js, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The message is in the pipeline stream from the start, but the stream
	// takes no hand-offs to audit yet (as while a stream is being placed):
	// every attempt fails until it does, and none may give up.
	if err := topology.EnsureTopology(ctx, js, topology.TopologyOptions{}); err != nil {
		t.Fatal(err)
	}
	pipeline, err := js.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		t.Fatal(err)
	}
	cfg := pipeline.CachedInfo().Config
	if err := js.DeleteStream(ctx, subjects.StreamPipeline); err != nil {
		t.Fatal(err)
	}
	narrow := cfg
	narrow.Subjects = []string{subjects.PipeStage(subjects.Execute)}
	if _, err := js.CreateStream(ctx, narrow); err != nil {
		t.Fatal(err)
	}
	inv := envelope.Invocation{ID: "inv-1", Tenant: "acme", Event: envelope.Event{Seq: 1}}
	data, _ := json.Marshal(inv)
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subjects.Pipe(subjects.Execute, "normal", "acme"), Data: data}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.endExhaustedRetrying(ctx, maxDeliveriesAdvisory{Stream: subjects.StreamPipeline, StreamSeq: 1, Deliveries: 5})
	}()
	time.Sleep(500 * time.Millisecond) // a few attempts fail meanwhile
	select {
	case <-done:
		t.Fatal("gave up while the hand-off could not be stored")
	default:
	}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the exhausted message was never ended")
	}
	stream, err := js.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.GetMsg(ctx, 1); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("exhausted message still there: %v", err)
	}
	m, err := stream.GetLastMsgForSubject(ctx, subjects.Pipe(subjects.Audit, "normal", "acme"))
	if err != nil {
		t.Fatalf("no hand-off to audit: %v", err)
	}
	var ended envelope.Invocation
	if err := json.Unmarshal(m.Data, &ended); err != nil || ended.Error == nil || ended.Error.ECode != api.EDeliveryExhausted {
		t.Fatalf("hand-off to audit: %s (%v)", m.Data, err)
	}
}
