package auditchain_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/subjects"
)

// publisher is one audit process's JetStream: what it publishes onto AUDIT
// is handed to its Leaves as acknowledged.
type publisher struct {
	tr     *trail
	leaves *auditchain.Leaves
	js     jetstream.JetStream
}

func (tr *trail) publisher() *publisher {
	tr.t.Helper()
	l := auditchain.NewLeaves()
	js, err := jetstream.New(tr.js.Conn(), jetstream.WithPublishAsyncAckHandler(l.Published))
	if err != nil {
		tr.t.Fatal(err)
	}
	return &publisher{tr: tr, leaves: l, js: l.Wrap(js)}
}

func (p *publisher) checkpointer(name string, every int) *auditchain.Checkpointer {
	c := p.tr.checkpointer(every)
	c.Writer, c.Leaves = name, p.leaves
	return c
}

// publish publishes event i of tenant, synchronously or not.
func (p *publisher) publish(tenant string, i int, async bool) {
	p.tr.t.Helper()
	subject, data := event(tenant, i)
	if !async {
		if _, err := p.js.Publish(p.tr.ctx, subject, data); err != nil {
			p.tr.t.Fatal(err)
		}
		return
	}
	f, err := p.js.PublishMsgAsync(&nats.Msg{Subject: subject, Data: data})
	if err != nil {
		p.tr.t.Fatal(err)
	}
	select {
	case <-f.Ok():
	case err := <-f.Err():
		p.tr.t.Fatal(err)
	}
}

// stepAll writes every checkpoint due with c.
func stepAll(t *testing.T, tr *trail, c *auditchain.Checkpointer) {
	t.Helper()
	for range 100 {
		more, err := c.Step(tr.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !more {
			return
		}
	}
}

// pastCreation waits until acknowledgements can no longer be the stream's
// before it was made again (auditchain's margin).
func pastCreation() { time.Sleep(1100 * time.Millisecond) }

// TestCheckpointFromPublishAcks: the events a process published (sync and
// async) are covered from their PubAcks, without reading them back; those
// published by another process, or whose hand-over never came (the
// publisher stopped after the PubAck), are read from the stream; the chain
// verifies intact with no gap either way.
func TestCheckpointFromPublishAcks(t *testing.T) {
	tr := newTrail(t)
	pastCreation()
	p := tr.publisher()
	c := p.checkpointer("p", 10)
	stepAll(t, tr, c) // the writer starts taking leaves
	other := 0
	for i := range 40 {
		switch {
		case i%10 == 3: // another audit process's
			tr.publish(event("globex", i))
			other++
		case i == 25: // acknowledged, but the worker died before handing it over
			tr.publish(event("acme", i))
			other++
		default:
			p.publish("acme", i, i%2 == 0)
		}
	}
	c.Interval = time.Nanosecond
	stepAll(t, tr, c)
	known, readBack := c.Covered()
	if known != uint64(40-other) || readBack != uint64(other) {
		t.Fatalf("%d events covered from their acks and %d read back, want %d and %d", known, readBack, 40-other, other)
	}
	r := tr.verify(auditchain.Options{})
	if !r.Intact() || r.Events != 40 || r.CoveredFirst != 1 || r.CoveredLast != 40 {
		t.Fatalf("report %+v: %v", r, found(r))
	}
}

// TestLeavesOfDeletedEvents: an event deleted after it was published and
// before a checkpoint covered it is named deleted, with its id: its leaf
// came from its PubAck. A duplicate publish (same message id) hands over
// nothing: its bytes are not what the stream holds.
func TestLeavesOfDeletedEvents(t *testing.T) {
	tr := newTrail(t)
	pastCreation()
	p := tr.publisher()
	c := p.checkpointer("p", 10)
	stepAll(t, tr, c)
	for i := range 10 {
		subject, data := event("acme", i)
		if _, err := p.js.Publish(tr.ctx, subject, data, jetstream.WithMsgID(fmt.Sprint("e", i))); err != nil {
			t.Fatal(err)
		}
	}
	// The same id with other bytes: deduplicated, nothing stored.
	if a, err := p.js.Publish(tr.ctx, subjects.AuditEvent("acme", "tool.succeeded"), []byte(`{"forged":1}`), jetstream.WithMsgID("e4")); err != nil || !a.Duplicate {
		t.Fatalf("duplicate publish: %+v %v", a, err)
	}
	audit, _ := tr.js.Stream(tr.ctx, subjects.StreamAudit)
	if err := audit.DeleteMsg(tr.ctx, 5); err != nil {
		t.Fatal(err)
	}
	stepAll(t, tr, c)
	if known, readBack := c.Covered(); known != 10 || readBack != 0 {
		t.Fatalf("%d covered from acks, %d read back, want 10 and 0", known, readBack)
	}
	wantFindings(t, tr.verify(auditchain.Options{}), "deleted 5 acme-4")
}

// TestLeavesOfARecreatedStream: acknowledgements of a stream deleted and
// made again (its sequences starting over) are not taken for the new
// stream's events: those are read back, and the new stream's checkpoint
// covers what it holds.
func TestLeavesOfARecreatedStream(t *testing.T) {
	tr := newTrail(t)
	pastCreation()
	p := tr.publisher()
	c := p.checkpointer("p", 100)
	stepAll(t, tr, c)
	for i := range 10 {
		p.publish("acme", i, false)
	}
	tr.loosen(subjects.StreamAudit)
	for i := range 10 {
		tr.publish(event("globex", i)) // at the same sequences
	}
	c.Interval = time.Nanosecond
	stepAll(t, tr, c)
	if known, readBack := c.Covered(); known != 0 || readBack != 10 {
		t.Fatalf("%d covered from acks, %d read back, want 0 and 10", known, readBack)
	}
	if r := tr.verify(auditchain.Options{}); !r.Intact() || r.Events != 10 {
		t.Fatalf("report %+v: %v", r, found(r))
	}
}
