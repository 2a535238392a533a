package auditchain

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/subjects"
)

// Leaves are the leaf hashes of the AUDIT events this process published,
// by the sequence each one's PubAck gave: a PubAck that is not a duplicate
// says the stream stored these bytes at that sequence, so the checkpointer
// covers them without reading them back (most of a read's cost is the
// server's). A sequence it does not know (another process published it, or
// this one stopped between the PubAck and the hand-over) is read from the
// stream as before, so the chain has no gaps either way.
//
// Give the process's JetStream Published as its async ack handler
// (jetstream.WithPublishAsyncAckHandler) and publish through Wrap, which
// hands over synchronous publishes; Leaves record nothing until a
// Checkpointer uses them. The bytes hashed are the message's when its
// PubAck comes: a publisher must not reuse a message's Data for another
// before then (none does: each event is encoded afresh).
type Leaves struct {
	on atomic.Bool
	mu sync.Mutex
	m  map[uint64]known
	// pending are the leaves Authenticating hashed, by message, until
	// its acknowledgement comes (or its publish fails).
	pmu     sync.Mutex
	pending map[*nats.Msg]Hash
}

// hashed records the leaf of m, about to be published.
func (l *Leaves) hashed(m *nats.Msg, leaf Hash) {
	if l == nil || !l.on.Load() {
		return
	}
	l.pmu.Lock()
	if l.pending == nil {
		l.pending = make(map[*nats.Msg]Hash)
	}
	if len(l.pending) >= maxKnown {
		// Publishes that failed without a word: their acks never come.
		// Those in flight are hashed again when theirs do.
		clear(l.pending)
	}
	l.pending[m] = leaf
	l.pmu.Unlock()
}

// drop forgets the leaf of m (its publish failed), and returns it.
func (l *Leaves) drop(m *nats.Msg) (Hash, bool) {
	if l == nil {
		return Hash{}, false
	}
	l.pmu.Lock()
	h, ok := l.pending[m]
	if ok {
		delete(l.pending, m)
	}
	l.pmu.Unlock()
	return h, ok
}

// known is what a checkpoint needs of one event.
type known struct {
	leaf       Hash
	id, tenant string
	at         time.Time // when the PubAck came: the event was stored just before
}

// maxKnown bounds Leaves when no checkpoint takes them (another process
// writes every checkpoint, or the stream refuses them): past it, events
// are read back.
const maxKnown = 1 << 16

// recreatedMargin: a PubAck that came less than this after AUDIT's
// creation time may be the stream before it (deleted and made again, its
// sequences starting over) or a clock apart: those events are read back.
const recreatedMargin = time.Second

// NewLeaves returns empty Leaves; they hold nothing until a Checkpointer
// uses them, so every connection may have them.
func NewLeaves() *Leaves { return &Leaves{} }

// Published records m as stored at ack's sequence of AUDIT; anything else
// is ignored. Its signature is jetstream.MsgAckHandler's.
func (l *Leaves) Published(_ jetstream.JetStream, m *nats.Msg, ack *jetstream.PubAck) {
	if l == nil || m == nil {
		return
	}
	leaf, ok := l.drop(m)
	if !l.on.Load() || ack == nil || ack.Duplicate || ack.Stream != subjects.StreamAudit {
		return
	}
	if !ok {
		leaf = LeafHash(m.Subject, m.Data)
	}
	k := known{leaf: leaf, id: eventID(m.Data), tenant: tenantOf(m.Subject), at: time.Now()}
	l.mu.Lock()
	if l.m == nil {
		l.m = make(map[uint64]known, 2*DefaultEvery)
	}
	if len(l.m) < maxKnown {
		l.m[ack.Sequence] = k
	}
	l.mu.Unlock()
}

// take removes and returns what is known of first..last, and forgets
// everything before first (covered by a checkpoint already).
func (l *Leaves) take(first, last uint64, created time.Time) map[uint64]known {
	l.on.Store(true)
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[uint64]known, min(last-first+1, uint64(len(l.m))))
	for seq, k := range l.m {
		switch {
		case seq < first:
			delete(l.m, seq)
		case seq <= last:
			delete(l.m, seq)
			if k.at.After(created.Add(recreatedMargin)) {
				out[seq] = k
			}
		}
	}
	return out
}

// restore puts back what take returned, for a checkpoint not made.
func (l *Leaves) restore(taken map[uint64]known) {
	if l == nil || len(taken) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for seq, k := range taken {
		if len(l.m) < maxKnown {
			l.m[seq] = k
		}
	}
}

// forget drops what is known before first.
func (l *Leaves) forget(first uint64) {
	l.on.Store(true)
	l.mu.Lock()
	defer l.mu.Unlock()
	for seq := range l.m {
		if seq < first {
			delete(l.m, seq)
		}
	}
}

// Wrap returns js, whose synchronous publishes onto AUDIT hand their
// leaves to l (the asynchronous ones reach Published through the ack
// handler).
func (l *Leaves) Wrap(js jetstream.JetStream) jetstream.JetStream {
	return &leavesJS{JetStream: js, l: l}
}

type leavesJS struct {
	jetstream.JetStream
	l *Leaves
}

func (j *leavesJS) Publish(ctx context.Context, subject string, data []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return j.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data}, opts...)
}

func (j *leavesJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := j.JetStream.PublishMsg(ctx, m, opts...)
	if err == nil {
		j.l.Published(j.JetStream, m, ack)
	}
	return ack, err
}
