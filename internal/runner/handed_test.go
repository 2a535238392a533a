package runner

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/seal"
	"go.opentelemetry.io/otel"
	"io"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/subjects"
)

func TestHandedGivesUpOnceAndOnlyTheSameBytes(t *testing.T) {
	h := NewHanded([]string{subjects.Execute})
	inv := &envelope.Invocation{ID: "i-1", Tenant: "acme"}
	data := []byte(`{"id":"i-1"}`)
	if h.put(subjects.Verify, "m-1", data, inv) {
		t.Fatal("held a hand-off to a stage that does not read in this process")
	}
	failed := &envelope.Invocation{ID: "i-2", Error: api.NewError(api.InternalError, api.EInternal, "x")}
	if h.put(subjects.Execute, "m-2", data, failed) {
		t.Fatal("held an invocation that ended in an error")
	}
	if !h.put(subjects.Execute, "m-1", data, inv) {
		t.Fatal("did not hold a hand-off to a stage read here")
	}
	if got := h.take("m-1", []byte(`{"id":"i-1","x":1}`)); got != nil {
		t.Fatal("gave the invocation for other bytes under its id")
	}
	if got := h.take("m-1", bytes.Clone(data)); got != inv {
		t.Fatalf("took %p, want the invocation handed on (%p)", got, inv)
	}
	if got := h.take("m-1", data); got != nil {
		t.Fatal("gave the same invocation twice")
	}
	var none *Handed
	if none.put(subjects.Execute, "m-3", data, inv) || none.take("m-3", data) != nil {
		t.Fatal("a nil Handed held something")
	}
}

func TestHandedStaysBounded(t *testing.T) {
	h := NewHanded([]string{subjects.Execute})
	small := []byte(`{}`)
	for i := range handedMax + 10 {
		h.put(subjects.Execute, fmt.Sprint("never-", i), small, &envelope.Invocation{})
	}
	if h.n != handedMax || len(h.held) != handedMax {
		t.Fatalf("holds %d (%d in the map), want at most %d", h.n, len(h.held), handedMax)
	}
	if h.take("never-0", small) != nil || h.take(fmt.Sprint("never-", handedMax+9), small) == nil {
		t.Fatal("did not drop the oldest first")
	}

	h = NewHanded([]string{subjects.Execute})
	big := make([]byte, 1<<20)
	for i := range 20 {
		h.put(subjects.Execute, fmt.Sprint("big-", i), big, &envelope.Invocation{})
	}
	if h.size > handedMaxBytes {
		t.Fatalf("holds %d bytes, over %d", h.size, handedMaxBytes)
	}

	// Taken at once, as in a process that reads every hand-off: the queue
	// of keys does not grow with the calls.
	h = NewHanded([]string{subjects.Execute})
	for i := range 20 * handedMax {
		id := fmt.Sprint("m-", i)
		h.put(subjects.Execute, id, small, &envelope.Invocation{})
		if h.take(id, small) == nil {
			t.Fatal("did not take what was just held")
		}
	}
	if h.n != 0 || h.size != 0 || len(h.queue) > 4*handedMax+64 {
		t.Fatalf("after every hand-off was taken: %d held, %d bytes, %d keys queued", h.n, h.size, len(h.queue))
	}
}

// publishedJS records what is published and acknowledges it at once.
type publishedJS struct {
	jetstream.JetStream
	mu   sync.Mutex
	msgs []*nats.Msg
}

func (j *publishedJS) PublishMsgAsync(m *nats.Msg, _ ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	j.mu.Lock()
	j.msgs = append(j.msgs, m)
	j.mu.Unlock()
	return ackedFuture{}, nil
}

// TestHandOffInProcess: a stage's hand-off to a stage of the same process
// is taken by that stage's Runner as the invocation itself, which encodes
// to exactly the bytes published; read as another process's, or by a
// Runner without Handed, the same message is decoded.
func TestHandOffInProcess(t *testing.T) {
	handed := NewHanded([]string{subjects.Route, subjects.Execute})
	js := &publishedJS{}
	inv := &envelope.Invocation{ID: "i-1", Tenant: "acme", Status: api.StatusPending, ReceivedAt: time.Now().UTC(),
		Request: &api.Request{ToolID: "echo", Parameters: []byte(`{"text":"hi"}`)}}
	in, err := Handoff(inv, subjects.Route)
	if err != nil {
		t.Fatal(err)
	}
	route := &Runner{Name: subjects.Route, Stage: passStage{}, JS: js, AckWait: 30 * time.Second, MaxDeliver: 5,
		Timeout: 30 * time.Second, Handed: handed}
	var settling sync.WaitGroup
	route.handle(&heldMsg{data: in.Data, md: &jetstream.MsgMetadata{NumDelivered: 1, Stream: subjects.StreamPipeline,
		Sequence: jetstream.SequencePair{Stream: 9}}}, &settling, func() {})
	settling.Wait()
	if len(js.msgs) != 1 {
		t.Fatalf("route published %d messages, want its hand-off", len(js.msgs))
	}
	// The server stores the hand-off with the message id it was published
	// under (jetstream.WithMsgID), which readers find in its header.
	out := js.msgs[0]
	out.Header.Set(jetstream.MsgIDHeader, HopID(inv, subjects.Execute))
	ours := func(string, nats.Header, []byte) (bool, error) { return true, nil }
	var own int
	decodeOwn = func(b []byte) (*envelope.Invocation, error) { own++; return envelope.DecodeOwn(b) }
	t.Cleanup(func() { decodeOwn = envelope.DecodeOwn })

	// Another process: its own Handed, and not its own signature.
	elsewhere := &Runner{Name: subjects.Execute, Stage: passStage{},
		Senders: func(string, nats.Header, []byte) (bool, error) { return false, nil }, Handed: NewHanded([]string{subjects.Execute})}
	decoded, err := elsewhere.decode(out.Subject, out.Header, out.Data, 10)
	if err != nil {
		t.Fatal(err)
	}
	execute := &Runner{Name: subjects.Execute, Stage: passStage{}, Senders: ours, Handed: handed}
	got, err := execute.decode(out.Subject, out.Header, out.Data, 10)
	if err != nil {
		t.Fatal(err)
	}
	if own != 0 {
		t.Fatalf("decoded the hand-off %d times, want it taken", own)
	}
	b, err := envelope.Encode(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, out.Data) {
		t.Fatalf("the invocation taken encodes to\n%s\nnot what was published\n%s", b, out.Data)
	}
	if got == decoded || got.ID != decoded.ID || len(got.Metadata.Stages) != 1 || got.Metadata.Stages[0].Stage != subjects.Route {
		t.Fatalf("taken %+v, decoded %+v", got, decoded)
	}
	// Read again (a redelivery), it is decoded: it was given up once.
	if _, err := execute.decode(out.Subject, out.Header, out.Data, 10); err != nil || own != 1 {
		t.Fatalf("a second read decoded %d times (err %v), want once", own, err)
	}
}

// signedJS acknowledges every publish at once, with a future that holds
// the message as published, as the client's does; it keeps the last.
type signedJS struct {
	jetstream.JetStream
	last *nats.Msg
}

func (j *signedJS) PublishMsgAsync(m *nats.Msg, _ ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	j.last = m
	return sentFuture{m}, nil
}

type sentFuture struct{ m *nats.Msg }

func (sentFuture) Ok() <-chan *jetstream.PubAck { return ackedOk }
func (sentFuture) Err() <-chan error            { return nil }
func (f sentFuture) Msg() *nats.Msg             { return f.m }

// signedHop is a process whose route hands a call to its execute, signed
// as serve signs it: hop hands one on and returns the message published;
// execute reads it, with checks counting the checks of its sender.
func signedHop(tb testing.TB) (hop func() *nats.Msg, execute *Runner, checks *int, inv *envelope.Invocation) {
	tb.Helper()
	keys := map[busauth.Role]ed25519.PrivateKey{}
	pubs := map[busauth.Role]ed25519.PublicKey{}
	for _, role := range []busauth.Role{busauth.RoleRoute, busauth.RoleExecute} {
		pub, priv, err := ed25519.GenerateKey(nil)
		if err != nil {
			tb.Fatal(err)
		}
		keys[role], pubs[role] = priv, pub
	}
	msgs := seal.NewMessages(pubs)
	signer := msgs.NewSigner(busauth.RoleRoute, keys[busauth.RoleRoute])
	msgs.NewSigner(busauth.RoleExecute, keys[busauth.RoleExecute])
	checks = new(int)
	senders := func(subject string, h nats.Header, data []byte) (bool, error) {
		*checks++
		_, ours, err := msgs.Check(subject, h, data)
		return ours, err
	}
	handed := NewHanded([]string{subjects.Route, subjects.Execute})
	inv = &envelope.Invocation{ID: "i-1", Tenant: "acme", Status: api.StatusPending, ReceivedAt: time.Now().UTC(),
		Request: &api.Request{ToolID: "echo", Parameters: []byte(`{"items":[` + strings.Repeat(`"hello",`, 200) + `"hi"]}`)}}
	in, err := Handoff(inv, subjects.Route)
	if err != nil {
		tb.Fatal(err)
	}
	js := &signedJS{}
	route := &Runner{Name: subjects.Route, Stage: passStage{}, JS: seal.SigningJetStream(js, signer), AckWait: 30 * time.Second,
		MaxDeliver: 5, Timeout: 30 * time.Second, Handed: handed, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Senders: func(string, nats.Header, []byte) (bool, error) { return false, nil }} // its input is not signed here
	route.tracer, route.spanName = otel.Tracer(tracerName), "toolgate."+route.Name
	execute = &Runner{Name: subjects.Execute, Stage: passStage{}, Senders: senders, Handed: handed}
	msg := &heldMsg{data: in.Data, md: &jetstream.MsgMetadata{NumDelivered: 1, Stream: subjects.StreamPipeline,
		Sequence: jetstream.SequencePair{Stream: 9}}}
	hop = func() *nats.Msg {
		var settling sync.WaitGroup
		route.handle(msg, &settling, func() {})
		settling.Wait()
		return js.last
	}
	return hop, execute, checks, inv
}

// TestSignedHandOffTakenUnchecked: a hand-off this process signed, read
// back byte for byte as sent, is taken without its check (which would
// recompute the proof it carries); any change to its subject, signer,
// proof, seal or data sends it to the check, which refuses a forgery.
func TestSignedHandOffTakenUnchecked(t *testing.T) {
	hop, execute, checks, inv := signedHop(t)
	for _, c := range []struct {
		name   string
		change func(m *nats.Msg)
		taken  bool // without the check
		forged bool // refused by the check
	}{
		{"as sent", func(*nats.Msg) {}, true, false},
		{"another subject", func(m *nats.Msg) { m.Subject = subjects.Pipe(subjects.Execute, subjects.PriorityHigh, "acme") }, false, true},
		{"another signer", func(m *nats.Msg) { m.Header.Set(seal.HeaderSigner, string(busauth.RoleValidate)) }, false, true},
		{"another MAC", func(m *nats.Msg) {
			mac := []byte(m.Header.Get(seal.HeaderMAC))
			mac[0] ^= 1
			m.Header.Set(seal.HeaderMAC, string(mac))
		}, false, true},
		{"a seal added", func(m *nats.Msg) { m.Header.Set(seal.HeaderSeal, seal.SealReceipt) }, false, true},
		{"other data", func(m *nats.Msg) { m.Data = bytes.Replace(m.Data, []byte(`"hi"`), []byte(`"ho"`), 1) }, false, true},
	} {
		sent := hop()
		m := &nats.Msg{Subject: sent.Subject, Header: maps.Clone(sent.Header), Data: bytes.Clone(sent.Data)}
		if m.Header.Get(seal.HeaderMAC) == "" {
			t.Fatalf("the hand-off carries no MAC: %v", m.Header)
		}
		c.change(m)
		*checks = 0
		got, err := execute.decode(m.Subject, m.Header, m.Data, 10)
		if taken := *checks == 0; taken != c.taken {
			t.Errorf("%s: taken without its check: %v, want %v", c.name, taken, c.taken)
		}
		if forged := got == nil; forged != c.forged {
			t.Errorf("%s: refused: %v (%v), want %v", c.name, forged, err, c.forged)
		}
		if got != nil && (got.ID != inv.ID || got.Request == nil) {
			t.Errorf("%s: read %+v", c.name, got)
		}
	}
}

// TestSignedHandOffOfARoleNotItsOwn: a hand-off recorded as signed by a
// role that may not send on its subject is left to the check, as the
// check would refuse it.
func TestSignedHandOffOfARoleNotItsOwn(t *testing.T) {
	h := NewHanded([]string{subjects.Execute})
	subject := subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "acme")
	data := []byte(`{"id":"i-1"}`)
	for _, c := range []struct {
		signer busauth.Role
		taken  bool
	}{{busauth.RoleRoute, true}, {busauth.RoleVerify, false}} {
		inv := &envelope.Invocation{ID: "i-1"}
		if !h.put(subjects.Execute, "m-1", data, inv) {
			t.Fatal("not held")
		}
		sent := nats.Header{seal.HeaderSigner: {string(c.signer)}, seal.HeaderMAC: {"bWFj"}, jetstream.MsgIDHeader: {"m-1"}}
		h.signed("m-1", subject, data, sent)
		if got := h.takeSigned(subject, sent, bytes.Clone(data)); (got == inv) != c.taken {
			t.Errorf("signed by %s: taken %v, want %v", c.signer, got == inv, c.taken)
		}
	}
}

// TestHandOffReadBeforeItsProofIsNoted: a hand-off read back before its
// sender noted how it was signed is checked, and then taken as the
// invocation held, not decoded.
func TestHandOffReadBeforeItsProofIsNoted(t *testing.T) {
	hop, execute, checks, _ := signedHop(t)
	m := hop()
	id := m.Header.Get(jetstream.MsgIDHeader)
	execute.Handed.mu.Lock()
	e := execute.Handed.held[id]
	held := e.inv
	e.proof = "" // as before signed ran
	execute.Handed.held[id] = e
	execute.Handed.mu.Unlock()
	*checks = 0
	got, err := execute.decode(m.Subject, m.Header, m.Data, 10)
	if err != nil || *checks != 1 || got != held {
		t.Fatalf("read with %d checks: %p (%v), want the invocation held (%p) after one check", *checks, got, err, held)
	}
}
