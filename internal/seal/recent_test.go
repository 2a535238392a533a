package seal

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/subjects"
)

// countVerify counts ed25519 verifications until the test ends.
func countVerify(t *testing.T) *atomic.Int64 {
	var n atomic.Int64
	verify = func(pub ed25519.PublicKey, msg, sig []byte) bool {
		n.Add(1)
		return ed25519.Verify(pub, msg, sig)
	}
	t.Cleanup(func() { verify = ed25519.Verify })
	return &n
}

// TestRecentMessages: a message signed by a role of this process is
// accepted without a verification, once, and reported as its own; anything
// else is verified, and
// what does not verify is refused as before.
func TestRecentMessages(t *testing.T) {
	priv, msgs := roleKeys(t)
	verifications := countVerify(t)
	// A cancel, which control signs (a hand-off carries a MAC instead:
	// TestHandoffMAC).
	toExecute := subjects.Cancel("acme", "a")
	body := []byte(`{"id":"a"}`)
	local := msgs.NewSigner(busauth.RoleControl, priv[busauth.RoleControl])
	check := func(name string, s *Signer, subject string, body, sent []byte, wantErr bool, wantVerify int64) {
		t.Helper()
		before := verifications.Load()
		h := s.Sign(subject, nil, sent)
		_, ours, err := msgs.Check(subject, h, body)
		if (err != nil) != wantErr {
			t.Errorf("%s: err %v, want error %v", name, err, wantErr)
		}
		// Only a signature this process made over exactly these bytes is
		// reported as its own.
		if want := !wantErr && wantVerify == 0; ours != want {
			t.Errorf("%s: ours %v, want %v", name, ours, want)
		}
		if got := verifications.Load() - before; got != wantVerify {
			t.Errorf("%s: %d verifications, want %d", name, got, wantVerify)
		}
	}
	check("signed in this process", local, toExecute, body, body, false, 0)
	check("signed elsewhere", NewSigner(busauth.RoleControl, priv[busauth.RoleControl]), toExecute, body, body, false, 1)
	check("altered after signing", local, toExecute, []byte(`{"id":"b"}`), body, true, 1)
	_, other, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	check("a local signer with a key hops.pub does not list", msgs.NewSigner(busauth.RoleControl, other), toExecute, body, body, true, 1)
	check("a local signer off its subjects", msgs.NewSigner(busauth.RoleVerify, priv[busauth.RoleVerify]), toExecute, body, body, true, 0)

	// A redelivery of a message already read is verified.
	h := local.Sign(toExecute, nil, body)
	for i, want := range []int64{0, 1} {
		before := verifications.Load()
		if _, err := msgs.Sender(toExecute, h, body); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if got := verifications.Load() - before; got != want {
			t.Errorf("read %d: %d verifications, want %d", i, got, want)
		}
	}
}

// TestRecentSeals: execute accepts the seals authorize made in the same
// process without verifying them, and refuses an altered one.
func TestRecentSeals(t *testing.T) {
	verifications := countVerify(t)
	k := newKey(t)
	s := NewSealer(k)
	exp := time.Now().Add(time.Hour)
	if err := s.Verifier().Check(admitted(t, s, exp), time.Now()); err != nil || verifications.Load() != 0 {
		t.Fatalf("a seal of this process: %v after %d verifications, want nil after 0", err, verifications.Load())
	}
	if err := NewVerifier(k.Public().(ed25519.PublicKey)).Check(admitted(t, s, exp), time.Now()); err != nil || verifications.Load() != 1 {
		t.Fatalf("a seal checked by another process: %v after %d verifications, want nil after 1", err, verifications.Load())
	}
	inv := admitted(t, s, exp)
	inv.Authz.Seal.Expires++
	if err := s.Verifier().Check(inv, time.Now()); err == nil {
		t.Fatal("an altered seal of this process was accepted")
	}
}

// TestRecentForgets: the ring keeps the newest signatures; older ones are
// verified again.
func TestRecentForgets(t *testing.T) {
	r := newRecent(2)
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	var texts, sigs [][]byte
	for i := range 3 {
		text := fmt.Appendf(nil, "message %d", i)
		sig := ed25519.Sign(priv, text)
		r.add(pub, text, sig)
		texts, sigs = append(texts, text), append(sigs, sig)
	}
	if r.take(pub, texts[0], sigs[0]) {
		t.Error("the oldest signature outlived the ring")
	}
	if !r.take(pub, texts[2], sigs[2]) || !r.take(pub, texts[1], sigs[1]) {
		t.Error("the newest signatures were forgotten")
	}
	if len(r.seen) != 0 {
		t.Errorf("%d signatures left after each was taken", len(r.seen))
	}
}

// TestRecentConcurrent runs signers and checkers at once (under -race).
func TestRecentConcurrent(t *testing.T) {
	priv, msgs := roleKeys(t)
	s := msgs.NewSigner(busauth.RoleRoute, priv[busauth.RoleRoute])
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				subject := subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "acme")
				body, _ := json.Marshal(map[string]int{"g": g, "i": i})
				if _, err := msgs.Sender(subject, s.Sign(subject, nil, body), body); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkMessageCheckLocal is BenchmarkMessageCheck for a message a
// role of the same process signed.
func BenchmarkMessageCheckLocal(b *testing.B) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	msgs := NewMessages(map[busauth.Role]ed25519.PublicKey{busauth.RoleRoute: pub})
	s := msgs.NewSigner(busauth.RoleRoute, priv)
	subject := subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "acme")
	body := make([]byte, 2048)
	for b.Loop() {
		b.StopTimer()
		h := s.Sign(subject, nil, body) // each is read once
		b.StartTimer()
		if _, err := msgs.Sender(subject, h, body); err != nil {
			b.Fatal(err)
		}
	}
}
