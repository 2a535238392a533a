package auditchain

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/allocbudget"
	"github.com/toolgate/toolgate/subjects"
)

// BenchmarkLeavesPublished is the audit process's hand-over of one event
// of a terminal event's size (about 800 bytes) as its PubAck comes: leaf
// hash, id and tenant, recorded by sequence; a checkpoint takes them
// every DefaultEvery.
func BenchmarkLeavesPublished(b *testing.B) {
	l := NewLeaves()
	l.on.Store(true)
	m := &nats.Msg{Subject: subjects.AuditEvent("acme", "tool.succeeded"), Data: fmt.Appendf(nil,
		`{"specversion":"1.0","id":"inv-1:tool.succeeded","source":"urn:toolgate:audit","type":"ai.agent.tool.succeeded","datacontenttype":"application/json","time":"2026-11-27T05:08:15.040990875Z","data":{"tenant_id":"acme","invocation_id":"inv-1","tool_id":"echo","tool_version":"1.0.0","status":"success","duration_ms":3,"result":{"echo":"%s"}},"tenantid":"acme"}`,
		strings.Repeat("x", 500))}
	ack := &jetstream.PubAck{Stream: subjects.StreamAudit}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		ack.Sequence = uint64(i + 1)
		l.Published(nil, m, ack)
		if ack.Sequence%DefaultEvery == 0 {
			clear(l.m) // as a checkpoint takes them
		}
	}
}

// BenchmarkEventMAC is the MAC audit adds to one event of a terminal
// event's size as it publishes it (the publish beneath does nothing).
func BenchmarkEventMAC(b *testing.B) {
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	js := Authenticating(nopAsync{}, NewEventKey(k), nil)
	subject := subjects.AuditEvent("acme", "tool.succeeded")
	data := fmt.Appendf(nil, `{"specversion":"1.0","id":"inv-1:tool.succeeded","data":{"result":{"echo":"%s"}}}`, strings.Repeat("x", 700))
	h := nats.Header{"Content-Type": {"application/cloudevents+json"}}
	m := &nats.Msg{Subject: subject, Header: h, Data: data}
	b.ReportAllocs()
	for b.Loop() {
		_, _ = js.PublishMsgAsync(m)
	}
}

type nopAsync struct{ jetstream.JetStream }

func (nopAsync) PublishMsgAsync(*nats.Msg, ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	return nil, nil
}

// eventMACBudget is the MAC's allocations per event, recorded: its header
// value, the string and its slice in one.
var eventMACBudget = map[string]float64{"event MAC": 1}

func TestEventMACAllocations(t *testing.T) {
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	ek := NewEventKey(k)
	js := Authenticating(nopAsync{}, ek, nil)
	subject := subjects.AuditEvent("acme", "tool.succeeded")
	data := []byte(`{"specversion":"1.0","id":"inv-1:tool.succeeded"}`)
	m := &nats.Msg{Subject: subject, Header: nats.Header{"Content-Type": {"application/cloudevents+json"}}, Data: data}
	allocbudget.Check(t, eventMACBudget, map[string]func(){"event MAC": func() { _, _ = js.PublishMsgAsync(m) }})
	if !ek.Authentic(LeafHash(subject, data), m.Header, time.Now()) {
		t.Fatalf("the event's MAC %q does not verify", m.Header.Get(HeaderEventMAC))
	}
	if m.Header.Get(HeaderEventMAC) != ek.Header(LeafHash(subject, data), time.Unix(0, mustNanos(t, m.Header.Get(HeaderEventMAC)))) {
		t.Fatal("Header and the published value differ")
	}
}

// mustNanos is the time a HeaderEventMAC value names.
func mustNanos(t *testing.T, v string) int64 {
	t.Helper()
	at, _, _ := strings.Cut(v, ".")
	n, err := strconv.ParseInt(at, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
