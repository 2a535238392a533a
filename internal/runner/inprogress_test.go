package runner

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

type slowStage struct{ d time.Duration }

func (s slowStage) Process(ctx context.Context, _ *envelope.Invocation) ([]stages.Output, error) {
	select {
	case <-time.After(s.d):
	case <-ctx.Done():
	}
	return nil, nil
}

// TestInProgressWhileStageWorks: a stage that works past the ack wait
// keeps its message, which is not delivered to anyone else meanwhile.
func TestInProgressWhileStageWorks(t *testing.T) {
	_, js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SLOW", Subjects: []string{"slow.>"}}); err != nil {
		t.Fatal(err)
	}
	const ackWait = time.Second
	c, err := js.CreateConsumer(ctx, "SLOW", jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "slow.1", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	msg := <-batch.Messages()
	if msg == nil {
		t.Fatal("no message")
	}
	// Another worker waits for whatever the ack wait sets free.
	other := make(chan jetstream.Msg, 1)
	go func() {
		b, err := c.Fetch(1, jetstream.FetchMaxWait(4*ackWait))
		if err == nil {
			other <- <-b.Messages()
		}
		close(other)
	}()
	r := &Runner{Name: subjects.Execute, JS: js, AckWait: ackWait, Timeout: time.Minute,
		Stage: slowStage{3 * ackWait}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if _, err := r.process(ctx, msg, &envelope.Invocation{ID: "i"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := msg.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	if m := <-other; m != nil {
		t.Fatal("the message was delivered again while its stage worked on it")
	}
}
