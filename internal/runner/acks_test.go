package runner

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// TestHandoffAcks: a hand-off published with its own reply subject is
// stored as published and acknowledged with the stream's PubAck, a
// duplicate as one; a hand-off no stream takes, or the stream refuses,
// fails; and a hand-off waiting when the connection is lost fails at once.
func TestHandoffAcks(t *testing.T) {
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv.ClientURL())
	base, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	js := HandoffAcks(base)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	subject := subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "acme")
	publish := func(id string, data []byte, h nats.Header) (*jetstream.PubAck, error) {
		t.Helper()
		if h == nil {
			h = nats.Header{}
		}
		h.Set(jetstream.MsgIDHeader, id)
		f, err := seal.PublishOwnedAsync(js, &nats.Msg{Subject: subject, Header: h, Data: data})
		if err != nil {
			return nil, err
		}
		if _, ours := f.(*handoffAck); !ours {
			t.Fatalf("a hand-off went through the client's publisher (%T)", f)
		}
		select {
		case a := <-f.Ok():
			return a, nil
		case err := <-f.Err():
			return nil, err
		case <-ctx.Done():
			t.Fatal("no acknowledgement")
		}
		return nil, nil
	}

	if _, err := publish("m-0", []byte(`{}`), nil); err == nil {
		t.Fatal("a hand-off no stream takes did not fail")
	}
	if err := topology.EnsureTopology(ctx, base, topology.TopologyOptions{}); err != nil {
		t.Fatal(err)
	}
	ack, err := publish("m-1", []byte(`{"id":"i-1"}`), nats.Header{"Content-Type": {"application/json"}})
	if err != nil || ack.Stream != subjects.StreamPipeline || ack.Sequence == 0 || ack.Duplicate {
		t.Fatalf("first publish: %+v, %v", ack, err)
	}
	stream, err := base.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := stream.GetMsg(ctx, ack.Sequence)
	if err != nil || string(stored.Data) != `{"id":"i-1"}` || stored.Header.Get("Content-Type") != "application/json" ||
		stored.Header.Get(jetstream.MsgIDHeader) != "m-1" || stored.Subject != subject {
		t.Fatalf("stored %+v, %v", stored, err)
	}
	again, err := publish("m-1", []byte(`{"id":"i-1"}`), nil)
	if err != nil || !again.Duplicate || again.Sequence != ack.Sequence {
		t.Fatalf("the same id again: %+v, %v, want a duplicate of %d", again, err, ack.Sequence)
	}
	var apiErr *jetstream.APIError
	if _, err := publish("m-2", []byte(`{}`), nats.Header{"Nats-Expected-Stream": {"ANOTHER"}}); !errors.As(err, &apiErr) {
		t.Fatalf("a hand-off the stream refuses: %v, want its API error", err)
	}

	// Never acknowledged, the connection up: failed once far behind.
	j := js.(*handoffAcks)
	j.horizon = 3
	forgotten := &handoffAck{ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1), sent: time.Now().Add(-2 * ackPatience)}
	j.mu.Lock()
	j.next++
	j.pending[j.next] = forgotten
	j.mu.Unlock()
	for i := range 3 {
		if _, err := publish("m-forgotten-"+strconv.Itoa(i), []byte(`{}`), nil); err != nil {
			t.Fatal(err)
		}
		if got := len(forgotten.err); got != min(i/2, 1) {
			t.Fatalf("after %d publishes, a hand-off never acknowledged had %d failures", i+1, got)
		}
	}
	if err := <-forgotten.err; !errors.Is(err, errLostAck) {
		t.Fatalf("a hand-off never acknowledged failed with %v", err)
	}

	// Lost before its acknowledgement: the server stops, what waits fails.
	waiting := &handoffAck{ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	j.mu.Lock()
	j.pending[^uint64(0)] = waiting // a token no acknowledgement names
	j.mu.Unlock()
	srv.Shutdown()
	select {
	case err := <-waiting.Err():
		if !errors.Is(err, nats.ErrDisconnected) {
			t.Fatalf("a hand-off waiting when the connection was lost failed with %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a hand-off waiting when the connection was lost did not fail")
	}
}

// BenchmarkHandoffAcks: a hand-off published and its acknowledgement
// awaited, 16 at a time, through the client's asynchronous publisher and
// through HandoffAcks, against an embedded server (whose work is the same
// in both).
func BenchmarkHandoffAcks(b *testing.B) {
	srv := natstest.Server(b)
	nc := natstest.Connect(b, srv.ClientURL())
	base, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := topology.EnsureTopology(ctx, base, topology.TopologyOptions{}); err != nil {
		b.Fatal(err)
	}
	subject := subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "acme")
	data := make([]byte, 2048)
	for _, c := range []struct {
		name string
		js   jetstream.JetStream
	}{{"client", base}, {"own", HandoffAcks(base)}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var r Runner
			futures := make([]jetstream.PubAckFuture, 0, 16)
			n := 0
			for b.Loop() {
				n++
				m := &nats.Msg{Subject: subject, Header: nats.Header{jetstream.MsgIDHeader: {c.name + strconv.Itoa(n)}}, Data: data}
				f, err := seal.PublishOwnedAsync(c.js, m)
				if err != nil {
					b.Fatal(err)
				}
				if futures = append(futures, f); len(futures) == cap(futures) {
					var timeout <-chan struct{}
					for _, f := range futures {
						if err := r.awaitAck(f, &timeout); err != nil {
							b.Fatal(err)
						}
					}
					futures = futures[:0]
				}
			}
		})
	}
}
