package runner

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/stages"
)

// gateStage is passStage with a gate that lets every message through.
type gateStage struct{ passStage }

func (gateStage) Defer(string, int, int) (time.Duration, bool) { return 0, false }

// countedMsg counts the reads of its metadata, which the client parses
// from the reply subject on each.
type countedMsg struct {
	*heldMsg
	reads int
}

func (m *countedMsg) Metadata() (*jetstream.MsgMetadata, error) {
	m.reads++
	return m.heldMsg.Metadata()
}

// TestGateReadsMetadataOnce: a gated stage's message has its metadata
// read once, by the gate, and handled with what was read.
func TestGateReadsMetadataOnce(t *testing.T) {
	r, held := routeHop(t, ackedJS{})
	r.Stage = gateStage{}
	msg := &countedMsg{heldMsg: held}
	m, later := r.deferred(msg)
	if later {
		t.Fatal("the gate let the message through, yet it was deferred")
	}
	var settling sync.WaitGroup
	r.handle(m, &settling, func() {})
	settling.Wait()
	if msg.reads != 1 {
		t.Fatalf("the metadata was read %d times, want 1", msg.reads)
	}
	if md, err := m.Metadata(); err != nil || md.Sequence.Stream != 9 || md.NumDelivered != 1 {
		t.Fatalf("the message handed on reads metadata %+v, %v", md, err)
	}
}

var _ stages.Gate = gateStage{}
