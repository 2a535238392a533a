package runner

import (
	"errors"
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

// refusedFuture is a publish the server refused.
type refusedFuture struct{ err chan error }

func (refusedFuture) Ok() <-chan *jetstream.PubAck { return nil }
func (f refusedFuture) Err() <-chan error          { return f.err }
func (refusedFuture) Msg() *nats.Msg               { return nil }

type futureJS struct {
	jetstream.JetStream
	f jetstream.PubAckFuture
}

func (j futureJS) PublishMsgAsync(*nats.Msg, ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	return j.f, nil
}

// settledMsg is a heldMsg that tells how it was settled.
type settledMsg struct {
	*heldMsg
	settled chan string
}

func (m settledMsg) Ack() error                       { m.settled <- "ack"; return nil }
func (m settledMsg) NakWithDelay(time.Duration) error { m.settled <- "nak"; return nil }

// TestUnacknowledgedHandOff: a message whose hand-off the server refuses,
// or never acknowledges, is put back (nak) for a retry, not acked: at once
// when refused, after the wait for an acknowledgement when none comes.
func TestUnacknowledgedHandOff(t *testing.T) {
	refused := make(chan error, 1)
	refused <- errors.New("refused")
	for _, c := range []struct {
		name   string
		f      jetstream.PubAckFuture
		within time.Duration
	}{
		{"refused", refusedFuture{refused}, 2 * time.Second},
		{"never acknowledged", heldFuture{make(chan *jetstream.PubAck)}, 5 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, held := routeHop(t, futureJS{f: c.f})
			r.publishWait = 300 * time.Millisecond
			msg := settledMsg{held, make(chan string, 1)}
			start := time.Now()
			var settling sync.WaitGroup
			r.handle(msg, &settling, func() {})
			settling.Wait()
			select {
			case how := <-msg.settled:
				if how != "nak" {
					t.Fatalf("settled by %s, want a nak", how)
				}
			default:
				t.Fatal("the message was not settled")
			}
			if took := time.Since(start); took > c.within {
				t.Fatalf("settled after %v", took)
			}
		})
	}
}
