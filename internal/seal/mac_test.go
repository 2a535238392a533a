package seal

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/allocbudget"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/subjects"
)

// The X25519 half of a role's private key matches the X25519 half of its
// public key, and both ends of a pair derive the same key, one per
// direction.
func TestPairKeyAgreement(t *testing.T) {
	priv, msgs := roleKeys(t)
	for _, r := range busauth.SigningRoles {
		x, err := x25519Private(priv[r])
		if err != nil {
			t.Fatal(err)
		}
		if !x.PublicKey().Equal(msgs.pairs.pubs[r]) {
			t.Fatalf("%s: the converted private key does not match the converted public key", r)
		}
	}
	a, b := newPairs(msgs.keys), newPairs(msgs.keys)
	a.hold(busauth.RoleRoute, priv[busauth.RoleRoute])
	b.hold(busauth.RoleExecute, priv[busauth.RoleExecute])
	ka, ok1 := a.key(busauth.RoleRoute, busauth.RoleExecute, busauth.RoleRoute)
	kb, ok2 := b.key(busauth.RoleRoute, busauth.RoleExecute, busauth.RoleExecute)
	if !ok1 || !ok2 || !bytes.Equal(ka.raw, kb.raw) {
		t.Fatalf("the two ends derive different keys (%v %v)", ok1, ok2)
	}
	back, _ := b.key(busauth.RoleExecute, busauth.RoleRoute, busauth.RoleExecute)
	if bytes.Equal(back.raw, ka.raw) {
		t.Fatal("both directions share a key")
	}
	if _, ok := a.key(busauth.RoleVerify, busauth.RoleAudit, busauth.RoleAudit); ok {
		t.Fatal("a process holding neither role derived their key")
	}
}

// TestHandoffMAC: a hand-off carries a MAC for the stage it is addressed
// to, which only a process holding that stage's key checks; everything
// else a signature. A MAC made by any other pair, over other bytes or for
// another stage fails, and so does a MAC anywhere but on a hand-off.
func TestHandoffMAC(t *testing.T) {
	priv, pubs := roleKeys(t)
	process := func(roles ...busauth.Role) (*Messages, map[busauth.Role]*Signer) {
		m := NewMessages(pubs.keys)
		s := map[busauth.Role]*Signer{}
		for _, r := range roles {
			s[r] = m.NewSigner(r, priv[r])
		}
		return m, s
	}
	_, routeProc := process(busauth.RoleRoute)
	executeMsgs, _ := process(busauth.RoleExecute)
	toExecute := subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "acme")
	body := []byte(`{"id":"a"}`)

	h := routeProc[busauth.RoleRoute].Sign(toExecute, nil, body)
	if h.Get(HeaderMAC) == "" || h.Get(HeaderSignature) != "" || h.Get(HeaderSigner) != "route" {
		t.Fatalf("a hand-off was sent with %v, want route's MAC and no signature", h)
	}
	if role, ours, err := executeMsgs.Check(toExecute, h, body); err != nil || role != busauth.RoleRoute || ours {
		t.Fatalf("execute's check of route's hand-off: %v %v %v", role, ours, err)
	}
	// Within one process the check finds the MAC among those made, once.
	m, both := process(busauth.RoleRoute, busauth.RoleExecute)
	local := both[busauth.RoleRoute].Sign(toExecute, nil, body)
	if _, ours, err := m.Check(toExecute, local, body); err != nil || !ours {
		t.Fatalf("a hand-off within one process: ours %v, %v", ours, err)
	}
	if _, ours, err := m.Check(toExecute, local, body); err != nil || ours {
		t.Fatalf("the same hand-off read again: ours %v, %v", ours, err)
	}
	// What is not a hand-off is signed as before.
	result := subjects.Result("acme", "did:agent:acme", "a")
	if r := routeProc[busauth.RoleRoute].Sign(result, nil, body); r.Get(HeaderSignature) == "" || r.Get(HeaderMAC) != "" {
		t.Fatalf("a result was sent with %v, want a signature", r)
	}
	// A hand-off signed by a process that does not know the reader's key
	// (an earlier version) is checked by its signature.
	if _, _, err := executeMsgs.Check(toExecute, NewSigner(busauth.RoleRoute, priv[busauth.RoleRoute]).Sign(toExecute, nil, body), body); err != nil {
		t.Fatalf("a signed hand-off: %v", err)
	}

	// A key hops.pub does not list for its role gets no pair key: what it
	// sends is signed, and fails as a forged signature.
	_, other, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	bogus := m.NewSigner(busauth.RoleRoute, other).Sign(toExecute, nil, body)
	if bogus.Get(HeaderMAC) != "" {
		t.Fatal("a key hops.pub does not list made a MAC")
	}
	if _, _, err := m.Check(toExecute, bogus, body); err == nil {
		t.Fatal("a hand-off signed with a key hops.pub does not list was accepted")
	}

	_, verifyProc := process(busauth.RoleVerify)
	claimed := func(role busauth.Role, hdr nats.Header) nats.Header {
		out := nats.Header{}
		for k, v := range hdr {
			out[k] = v
		}
		out.Set(HeaderSigner, string(role))
		return out
	}
	toVerify := subjects.Pipe(subjects.Verify, subjects.PriorityNormal, "acme")
	cases := []struct {
		name    string
		checker *Messages
		subject string
		header  nats.Header
		body    []byte
		want    string
	}{
		{"body altered", executeMsgs, toExecute, h, []byte(`{"id":"b"}`), "does not verify"},
		{"moved to another priority", executeMsgs, subjects.Pipe(subjects.Execute, subjects.PriorityHigh, "acme"), h, body, "does not verify"},
		{"sender renamed", executeMsgs, toExecute, claimed(busauth.RoleAuthorize, h), body, "does not verify"},
		// verify holds its own key with execute, not route's.
		{"another pair's MAC claiming route", executeMsgs, toExecute, claimed(busauth.RoleRoute, verifyProc[busauth.RoleVerify].Sign(toExecute, nil, body)), body, "does not verify"},
		{"a pair's genuine MAC onto a subject not the sender's", executeMsgs, toExecute, verifyProc[busauth.RoleVerify].Sign(toExecute, nil, body), body, "may not send"},
		{"checked by a process without the reader's key", NewMessages(pubs.keys), toExecute, h, body, "holds no key of execute"},
		{"a MAC on what is not a hand-off", executeMsgs, result, h, body, "only a hand-off"},
		{"addressed to another stage", executeMsgs, toVerify, h, body, "holds no key of verify"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := tc.checker.Check(tc.subject, tc.header, tc.body)
			var ae *api.Error
			if !errors.As(err, &ae) || ae.ECode != api.EMessageUnsigned || !strings.Contains(ae.Message, tc.want) {
				t.Fatalf("got %v, want E3224 saying %q", err, tc.want)
			}
		})
	}
}

func BenchmarkMessageMAC(b *testing.B) {
	sign := hopPaths(b)["sign"]
	for b.Loop() {
		sign()
	}
}

// BenchmarkHandoffCheck: the check of a hand-off's MAC, as the stage it
// is addressed to reads it in the process that sent it.
func BenchmarkHandoffCheck(b *testing.B) {
	check := hopPaths(b)["check"]
	for b.Loop() {
		check()
	}
}

// A hand-off's signing and its check in the process that reads it, on
// every hop: what each allocates.
var hopBudgets = map[string]float64{
	"sign":  3,
	"check": 0,
	// In the header the caller made (PublishOwnedAsync), which the
	// caller's message and header are counted in.
	"sign owned": 4,
}

func hopPaths(tb testing.TB) map[string]func() {
	priv, pubs := roleKeys(&testing.T{})
	m := NewMessages(pubs.keys)
	s := m.NewSigner(busauth.RoleRoute, priv[busauth.RoleRoute])
	m.NewSigner(busauth.RoleExecute, priv[busauth.RoleExecute])
	subject := subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "acme")
	body := bytes.Repeat([]byte("x"), 2048)
	h := s.Sign(subject, nil, body)
	js := SigningJetStream(&recordJS{}, s)
	return map[string]func(){
		"sign": func() { s.Sign(subject, nil, body) },
		"sign owned": func() {
			_, _ = PublishOwnedAsync(js, &nats.Msg{Subject: subject, Header: nats.Header{}, Data: body})
		},
		"check": func() {
			if _, _, err := m.Check(subject, h, body); err != nil {
				tb.Fatal(err)
			}
		},
	}
}

func TestHopAllocationBudget(t *testing.T) { allocbudget.Check(t, hopBudgets, hopPaths(t)) }

// BenchmarkHandoffLocal: a hand-off signed and read in one process, with
// as many in flight as the process remembers (each check finds its MAC).
func BenchmarkHandoffLocal(b *testing.B) {
	priv, pubs := roleKeys(&testing.T{})
	m := NewMessages(pubs.keys)
	s := m.NewSigner(busauth.RoleRoute, priv[busauth.RoleRoute])
	m.NewSigner(busauth.RoleExecute, priv[busauth.RoleExecute])
	subject := subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "acme")
	const inFlight = recentSize / 2
	bodies := make([][]byte, inFlight)
	heads := make([]nats.Header, inFlight)
	for i := range bodies {
		bodies[i] = []byte(fmt.Sprintf(`{"id":"%d"}`, i))
		heads[i] = s.Sign(subject, nil, bodies[i])
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, ours, err := m.Check(subject, heads[i], bodies[i]); err != nil || !ours {
			b.Fatal(ours, err)
		}
		heads[i] = s.Sign(subject, nil, bodies[i])
		i = (i + 1) % inFlight
	}
}

// recordJS keeps what is published on it.
type recordJS struct {
	jetstream.JetStream
	last *nats.Msg
}

func (j *recordJS) PublishMsgAsync(m *nats.Msg, _ ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	j.last = m
	return nil, nil
}

// TestSignedInPlace: a message handed over to be published as the
// caller's own is signed in its own header, with exactly the headers a
// copied one gets (MAC or signature), which the reader's check accepts;
// any other is signed in a copy, its header left as it was.
func TestSignedInPlace(t *testing.T) {
	priv, m := roleKeys(t)
	body := []byte(`{"id":"a"}`)
	for _, c := range []struct {
		name    string
		signer  *Signer
		subject string
		proof   string
	}{
		{"a hand-off, MAC'd", m.NewSigner(busauth.RoleRoute, priv[busauth.RoleRoute]), subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "acme"), HeaderMAC},
		{"a hand-off to a site, signed", m.NewSigner(busauth.RoleRoute, priv[busauth.RoleRoute]), subjects.PipeSite("lab", subjects.PriorityNormal, "acme"), HeaderSignature},
	} {
		m.NewSigner(busauth.RoleExecute, priv[busauth.RoleExecute])
		rec := &recordJS{}
		js := SigningJetStream(rec, c.signer)
		shared := nats.Header{"Content-Type": {"application/json"}}
		if _, err := js.PublishMsgAsync(&nats.Msg{Subject: c.subject, Header: shared, Data: body}); err != nil {
			t.Fatal(err)
		}
		copied := rec.last
		if len(shared) != 1 || copied.Header.Get(c.proof) == "" {
			t.Fatalf("%s: a copy signed %v, the header given became %v", c.name, copied.Header, shared)
		}
		own := &nats.Msg{Subject: c.subject, Header: nats.Header{"Content-Type": {"application/json"}}, Data: body}
		if _, err := PublishOwnedAsync(js, own); err != nil {
			t.Fatal(err)
		}
		if rec.last != own {
			t.Fatalf("%s: published a copy of a message handed over", c.name)
		}
		if !maps.EqualFunc(own.Header, copied.Header, slices.Equal) {
			t.Fatalf("%s: signed in place\n%v\nnot as a copy is\n%v", c.name, own.Header, copied.Header)
		}
		if _, err := m.Sender(own.Subject, own.Header, own.Data); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
}
