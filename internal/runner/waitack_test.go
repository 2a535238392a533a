package runner

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// heldJS acknowledges a publish only once ack is closed.
type heldJS struct {
	jetstream.JetStream
	ack chan *jetstream.PubAck
}

func (j heldJS) PublishMsgAsync(*nats.Msg, ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	return heldFuture{j.ack}, nil
}

type heldFuture struct{ ack chan *jetstream.PubAck }

func (f heldFuture) Ok() <-chan *jetstream.PubAck { return f.ack }
func (heldFuture) Err() <-chan error              { return nil }
func (heldFuture) Msg() *nats.Msg                 { return nil }

// TestWhoWaitsForAcks: a worker with a slot of its own (Workers ≥
// InFlight) settles its message itself, returning only once the hand-off
// is acknowledged; one with spare slots hands the wait on and returns at
// once. Either way the message is released only after the acknowledgement.
func TestWhoWaitsForAcks(t *testing.T) {
	for _, c := range []struct {
		name             string
		workers, slots   int
		returnsBeforeAck bool
	}{
		{"a slot each", 4, 4, false},
		{"spare slots", 1, 4, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			js := heldJS{ack: make(chan *jetstream.PubAck)}
			r, msg := routeHop(t, js)
			r.Workers, r.InFlight = c.workers, c.slots
			released := make(chan struct{})
			returned := make(chan struct{})
			var settling sync.WaitGroup
			go func() {
				r.handle(msg, &settling, func() { close(released) })
				close(returned)
			}()
			if c.returnsBeforeAck {
				select {
				case <-returned:
				case <-time.After(10 * time.Second):
					t.Fatal("the worker waited for the acknowledgement although it had spare slots")
				}
			} else {
				select {
				case <-returned:
					t.Fatal("the worker returned before its hand-off was acknowledged")
				case <-time.After(100 * time.Millisecond):
				}
			}
			select {
			case <-released:
				t.Fatal("the message was released before its hand-off was acknowledged")
			default:
			}
			close(js.ack)
			<-returned
			settling.Wait()
			select {
			case <-released:
			case <-time.After(10 * time.Second):
				t.Fatal("the message was never released")
			}
		})
	}
}
