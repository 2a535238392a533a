package seal

import (
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/subjects"
)

func roleKeys(t *testing.T) (map[busauth.Role]ed25519.PrivateKey, *Messages) {
	t.Helper()
	priv := map[busauth.Role]ed25519.PrivateKey{}
	pub := map[busauth.Role]ed25519.PublicKey{}
	for _, r := range busauth.SigningRoles {
		p, k, err := ed25519.GenerateKey(nil)
		if err != nil {
			t.Fatal(err)
		}
		priv[r], pub[r] = k, p
	}
	return priv, NewMessages(pub)
}

func TestMessageSender(t *testing.T) {
	priv, msgs := roleKeys(t)
	toExecute := subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "acme")
	body := []byte(`{"id":"a"}`)
	shared := nats.Header{"Content-Type": {"application/json"}}
	signed := NewSigner(busauth.RoleRoute, priv[busauth.RoleRoute]).Sign(toExecute, shared, body)
	if _, ok := shared[HeaderSigner]; ok {
		t.Fatal("Sign wrote into the header it was given")
	}
	if role, err := msgs.Sender(toExecute, signed, body); err != nil || role != busauth.RoleRoute {
		t.Fatalf("route's own hand-off: %v, %v", role, err)
	}
	cases := []struct {
		name    string
		subject string
		header  nats.Header
		body    []byte
		want    string
	}{
		{"unsigned", toExecute, shared, body, "no signature"},
		{"body altered", toExecute, signed, []byte(`{"id":"b"}`), "does not verify"},
		{"moved to another subject", subjects.Pipe(subjects.Execute, subjects.PriorityHigh, "acme"), signed, body, "does not verify"},
		{"signer renamed", toExecute, func() nats.Header {
			h := nats.Header{}
			for k, v := range signed {
				h[k] = v
			}
			h.Set(HeaderSigner, string(busauth.RoleAuthorize))
			return h
		}(), body, "does not verify"},
		{"unknown signer", toExecute, nats.Header{HeaderSigner: {"operator"}, HeaderSignature: {"AAAA"}}, body, "no signing key"},
		// verify's key is genuine, but verify may not hand calls to execute.
		{"a role onto a subject not its own", toExecute, NewSigner(busauth.RoleVerify, priv[busauth.RoleVerify]).Sign(toExecute, nil, body), body, "may not send"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := msgs.Sender(tc.subject, tc.header, tc.body)
			var ae *api.Error
			if !errors.As(err, &ae) || ae.ECode != api.EMessageUnsigned || !strings.Contains(ae.Message, tc.want) {
				t.Fatalf("got %v, want E3224 saying %q", err, tc.want)
			}
		})
	}
}

func TestRecordSignature(t *testing.T) {
	priv, msgs := roleKeys(t)
	sig := NewSigner(busauth.RoleAudit, priv[busauth.RoleAudit]).SignRecord("hook-child", []byte("acme\nparent\n{}"))
	if !msgs.Record(busauth.RoleAudit, "hook-child", []byte("acme\nparent\n{}"), sig) {
		t.Fatal("audit's own record does not verify")
	}
	for name, ok := range map[string]bool{
		"another role":    msgs.Record(busauth.RoleExecute, "hook-child", []byte("acme\nparent\n{}"), sig),
		"another kind":    msgs.Record(busauth.RoleAudit, "principal", []byte("acme\nparent\n{}"), sig),
		"another content": msgs.Record(busauth.RoleAudit, "hook-child", []byte("acme\nparent\n{\"x\":1}"), sig),
		"no signature":    msgs.Record(busauth.RoleAudit, "hook-child", []byte("acme\nparent\n{}"), ""),
	} {
		if ok {
			t.Errorf("%s: verified", name)
		}
	}
}

func TestTokens(t *testing.T) {
	var k1, k2 [32]byte
	k1[0], k2[0] = 1, 2
	a, b := NewTokens(&k1), NewTokens(&k2)
	sealed, err := a.Seal("eyJraWQiOi.raw.token")
	if err != nil {
		t.Fatal(err)
	}
	if !IsSealedToken(sealed) || strings.Contains(sealed, "raw.token") {
		t.Fatalf("sealed form %q shows the token", sealed)
	}
	again, _ := a.Seal("eyJraWQiOi.raw.token")
	if again == sealed {
		t.Fatal("two seals of one token are equal: the nonce is not random")
	}
	if raw, err := a.Open(sealed); err != nil || raw != "eyJraWQiOi.raw.token" {
		t.Fatalf("open: %q %v", raw, err)
	}
	for name, s := range map[string]string{
		"another key's": sealed, "raw": "eyJraWQiOi.raw.token", "truncated": sealed[:len(sealed)-4], "empty box": TokenPrefix,
	} {
		if _, err := b.Open(s); name != "another key's" && err == nil {
			t.Errorf("%s token opened", name)
		}
		if name == "another key's" {
			if _, err := b.Open(s); !errors.Is(err, ErrTokenSeal) {
				t.Errorf("opened with another deployment's key: %v", err)
			}
		}
	}
}

// TestTokensOpenWhatTheySealed: a token sealed by this process opens
// without decrypting, once; an altered one, or one opened already, takes
// the long way, which refuses what does not open.
func TestTokensOpenWhatTheySealed(t *testing.T) {
	var k [32]byte
	tk := NewTokens(&k)
	sealed, err := tk.Seal("eyJraWQiOi.raw.token")
	if err != nil {
		t.Fatal(err)
	}
	// A character well inside the box: the last may carry unused bits.
	i := len(sealed) - 10
	altered := sealed[:i] + map[bool]string{true: "B", false: "A"}[sealed[i] == 'A'] + sealed[i+1:]
	if _, err := tk.Open(altered); !errors.Is(err, ErrTokenSeal) {
		t.Fatalf("an altered sealed token opened: %v", err)
	}
	if _, ok := tk.made[sealed]; !ok {
		t.Fatal("the sealed token is not remembered")
	}
	for range 2 { // remembered, then the long way
		if raw, err := tk.Open(sealed); err != nil || raw != "eyJraWQiOi.raw.token" {
			t.Fatalf("open: %q %v", raw, err)
		}
		if _, ok := tk.made[sealed]; ok || tk.bytes != 0 {
			t.Fatalf("an opened token stays remembered (%d bytes)", tk.bytes)
		}
	}
	long := strings.Repeat("x", 16<<10)
	for range maxMadeBytes / len(long) {
		if _, err := tk.Seal(long); err != nil {
			t.Fatal(err)
		}
		if tk.bytes > maxMadeBytes {
			t.Fatalf("%d bytes of sealed tokens remembered", tk.bytes)
		}
	}
}

// BenchmarkTokenOpen: validate sealing a token and authorize opening it,
// in one process and in two (the difference is Open's).
func BenchmarkTokenOpen(b *testing.B) {
	var k [32]byte
	raw := "eyJ" + strings.Repeat("x", 900)
	for name, opener := range map[string]func(*Tokens) *Tokens{
		"same process": func(t *Tokens) *Tokens { return t },
		"elsewhere":    func(*Tokens) *Tokens { return NewTokens(&k) },
	} {
		b.Run(name, func(b *testing.B) {
			sealer := NewTokens(&k)
			o := opener(sealer)
			b.ReportAllocs()
			for b.Loop() {
				s, err := sealer.Seal(raw)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := o.Open(s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func FuzzTokenOpen(f *testing.F) {
	var k [32]byte
	tk := NewTokens(&k)
	s, _ := tk.Seal("tok")
	f.Add(s)
	f.Add(TokenPrefix + "AAAA")
	f.Fuzz(func(t *testing.T, in string) {
		raw, err := tk.Open(in)
		if err == nil {
			if again, err := tk.Seal(raw); err != nil || again == "" {
				t.Fatal("an opened token does not seal again")
			}
		}
	})
}

func FuzzSender(f *testing.F) {
	priv, msgs := roleKeys(&testing.T{})
	// A checker holding execute's key, which checks MACs of hand-offs to it.
	withExecute := NewMessages(msgs.keys)
	withExecute.NewSigner(busauth.RoleExecute, priv[busauth.RoleExecute])
	f.Add("toolgate.pipe.execute.normal.acme", "route", "AAAA", []byte("{}"))
	f.Fuzz(func(t *testing.T, subject, role, sig string, body []byte) {
		if _, err := msgs.Sender(subject, nats.Header{HeaderSigner: {role}, HeaderSignature: {sig}}, body); err == nil {
			t.Fatalf("a made-up signature verified: %q %q", role, sig)
		}
		if _, err := withExecute.Sender(subject, nats.Header{HeaderSigner: {role}, HeaderMAC: {sig}}, body); err == nil {
			t.Fatalf("a made-up MAC verified: %q %q", role, sig)
		}
	})
}

func BenchmarkMessageSign(b *testing.B) {
	_, k, _ := ed25519.GenerateKey(nil)
	s := NewSigner(busauth.RoleRoute, k)
	body := make([]byte, 2048)
	h := nats.Header{"Content-Type": {"application/json"}}
	for b.Loop() {
		s.Sign("toolgate.pipe.execute.normal.acme", h, body)
	}
}

func BenchmarkMessageCheck(b *testing.B) {
	p, k, _ := ed25519.GenerateKey(nil)
	m := NewMessages(map[busauth.Role]ed25519.PublicKey{busauth.RoleRoute: p})
	body := make([]byte, 2048)
	subject := "toolgate.pipe.execute.normal.acme"
	h := NewSigner(busauth.RoleRoute, k).Sign(subject, nil, body)
	for b.Loop() {
		if _, err := m.Sender(subject, h, body); err != nil {
			b.Fatal(err)
		}
	}
}

// TestMalformedSignatures: a signature or MAC of the wrong length, or not
// in canonical unpadded base64url, is refused, never read past its end.
func TestMalformedSignatures(t *testing.T) {
	priv, pubs := roleKeys(t)
	m := NewMessages(pubs.keys)
	route := m.NewSigner(busauth.RoleRoute, priv[busauth.RoleRoute])
	m.NewSigner(busauth.RoleExecute, priv[busauth.RoleExecute])
	toExecute := subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "acme")
	result := subjects.Result("acme", "did:agent:acme", "a")
	body := []byte(`{"id":"a"}`)
	mac := route.Sign(toExecute, nil, body).Get(HeaderMAC)
	sig := route.Sign(result, nil, body).Get(HeaderSignature)
	for name, c := range map[string]struct {
		subject, header, value string
	}{
		"long signature":   {result, HeaderSignature, strings.Repeat("A", 300)},
		"short signature":  {result, HeaderSignature, sig[:40]},
		"padded signature": {result, HeaderSignature, sig + "=="},
		"long MAC":         {toExecute, HeaderMAC, mac + "A"},
		"padded MAC":       {toExecute, HeaderMAC, mac + "="},
		"short MAC":        {toExecute, HeaderMAC, mac[:42]},
	} {
		h := nats.Header{HeaderSigner: {"route"}, c.header: {c.value}}
		if _, _, err := m.Check(c.subject, h, body); err == nil || !strings.Contains(err.Error(), "does not verify") {
			t.Errorf("%s: %v, want refused as not verifying", name, err)
		}
	}
}
