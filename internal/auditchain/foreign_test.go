package auditchain_test

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/subjects"
)

// auditProcess is an audit process on an authenticated bus: what it
// publishes onto AUDIT carries the event key's MAC.
func (tr *trail) auditProcess() *publisher {
	p := tr.publisher()
	p.js = auditchain.Authenticating(p.js, auditchain.NewEventKey(tr.key), p.leaves)
	return p
}

// attested is p's checkpointer, naming the events no audit process wrote.
func (p *publisher) attested(name string) *auditchain.Checkpointer {
	c := p.checkpointer(name, 100)
	c.Events = auditchain.NewEventKey(p.tr.key)
	c.Interval = time.Nanosecond
	return c
}

// copyOf publishes again, with another credential, the event at seq as
// stored, headers (its MAC) and all but the message id the stream would
// deduplicate, on subject (its own when "").
func (tr *trail) copyOf(seq uint64, subject string) uint64 {
	tr.t.Helper()
	st, err := tr.js.Stream(tr.ctx, subjects.StreamAudit)
	if err != nil {
		tr.t.Fatal(err)
	}
	m, err := st.GetMsg(tr.ctx, seq)
	if err != nil {
		tr.t.Fatal(err)
	}
	h := nats.Header{}
	for k, v := range m.Header {
		if !strings.HasPrefix(k, "Nats-") {
			h[k] = v
		}
	}
	if h.Get(auditchain.HeaderEventMAC) == "" {
		tr.t.Fatalf("event %d carries no MAC", seq)
	}
	if subject == "" {
		subject = m.Subject
	}
	a, err := tr.js.PublishMsg(tr.ctx, &nats.Msg{Subject: subject, Header: h, Data: m.Data})
	if err != nil {
		tr.t.Fatal(err)
	}
	return a.Sequence
}

// TestCheckpointNamesForeignEvents: the events of two audit processes
// (one's from its publish acks, the other's read back with their MAC)
// are audit's; an event published without the MAC, a copy of audit's
// events with it (of the checkpointing process's and of the other's), and
// an event moved to another tenant's subject are named as written by no
// audit process, on the bus and offline; a proof of a copied event's id
// proves the original, one of a forged event is refused.
func TestCheckpointNamesForeignEvents(t *testing.T) {
	tr := newTrail(t)
	a, b := tr.auditProcess(), tr.auditProcess()
	pastCreation()
	for i := range 4 {
		a.publish("acme", i, i%2 == 0) // seq 1..4
	}
	for i := 4; i < 6; i++ {
		b.publish("globex", i, true) // seq 5, 6
	}
	forged := tr.publish(event("acme", 99))            // seq 7: no MAC
	copyA := tr.copyOf(2, "")                          // seq 8: a's acme-1 again
	copyB := tr.copyOf(5, "")                          // seq 9: b's globex-4 again
	moved := tr.copyOf(6, "audit.acme.tool.succeeded") // seq 10: globex-5's MAC on acme's subject
	a.publish("acme", 6, false)                        // seq 11: audit's again
	stepAll(t, tr, a.attested("a"))

	want := []string{
		fmt.Sprintf("foreign %d acme-99", forged),
		fmt.Sprintf("foreign %d acme-1", copyA),
		fmt.Sprintf("foreign %d globex-4", copyB),
		fmt.Sprintf("foreign %d globex-5", moved),
	}
	wantFindings(t, tr.verify(auditchain.Options{}), want...)
	wantFindings(t, verifyFile(t, tr.export(auditchain.ExportOptions{}), tr.key.Public().(ed25519.PublicKey)), want...)

	pub := tr.key.Public().(ed25519.PublicKey)
	if p, err := auditchain.Prove(tr.ctx, auditchain.Bus{JS: tr.js}, "acme-1", pub); err != nil || p.Seq != 2 {
		t.Errorf("proof of acme-1: %+v %v, want the original at seq 2", p, err)
	}
	if _, err := auditchain.Prove(tr.ctx, auditchain.Bus{JS: tr.js}, "acme-99", pub); !errors.Is(err, auditchain.ErrForeign) {
		t.Errorf("proof of a forged event: %v, want ErrForeign", err)
	}

	// Another writer takes over: a copy of an event the first writer
	// covered is still not audit's.
	again := tr.copyOf(3, "")
	b.publish("globex", 7, false)
	stepAll(t, tr, b.attested("b"))
	want = append(want, fmt.Sprintf("foreign %d acme-2", again))
	wantFindings(t, tr.verify(auditchain.Options{}), want...)
}

// TestUnattestedCheckpoints: checkpoints that do not say which events are
// audit's (version 1, as made before, or on a bus without authentication)
// still verify, and the report says which ranges they cover; a forged
// event there is not named.
func TestUnattestedCheckpoints(t *testing.T) {
	tr := newTrail(t)
	tr.fill(0, 20)
	tr.checkpoint(10)
	r := tr.verify(auditchain.Options{})
	if !r.Intact() || len(r.Unattested) != 1 || r.Unattested[0].Seq != 1 || r.Unattested[0].Last != 20 {
		t.Fatalf("verify: %+v, want intact with 1..20 unattested", r)
	}
	r = verifyFile(t, tr.export(auditchain.ExportOptions{}), tr.key.Public().(ed25519.PublicKey))
	if !r.Intact() || len(r.Unattested) != 1 {
		t.Fatalf("verify offline: %+v, want intact with 1..20 unattested", r)
	}
}

// TestEventMAC: the MAC holds for its subject, bytes and key, within
// MACWindow of when it was made.
func TestEventMAC(t *testing.T) {
	tr := newTrail(t)
	k := auditchain.NewEventKey(tr.key)
	subject, data := event("acme", 1)
	now := time.Now()
	leaf := auditchain.LeafHash(subject, data)
	h := nats.Header{auditchain.HeaderEventMAC: {k.Header(leaf, now)}}
	if !k.Authentic(leaf, h, now.Add(time.Second)) {
		t.Fatal("a fresh MAC does not verify")
	}
	other := newTrail(t)
	for what, ok := range map[string]bool{
		"another subject": k.Authentic(auditchain.LeafHash("audit.globex.tool.succeeded", data), h, now),
		"other bytes":     k.Authentic(auditchain.LeafHash(subject, append(append([]byte(nil), data...), ' ')), h, now),
		"stored later":    k.Authentic(leaf, h, now.Add(auditchain.MACWindow+time.Second)),
		"another key":     auditchain.NewEventKey(other.key).Authentic(leaf, h, now),
		"no MAC":          k.Authentic(leaf, nats.Header{}, now),
	} {
		if ok {
			t.Errorf("a MAC with %s verifies", what)
		}
	}
	var _ jetstream.JetStream = auditchain.Authenticating(tr.js, k, nil)
}
