package seal

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"maps"
	"sync"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/subjects"
)

// Headers of a signed message: the role that sent it and its Ed25519
// signature (base64url) over the subject and the body.
const (
	HeaderSigner    = "Toolgate-Signer"
	HeaderSignature = "Toolgate-Signature"
)

// HeaderSeal, set to SealReceipt on a result audit publishes, says that
// the receipt the message carries is its signature (auditchain.SealResult):
// Sign then adds the signer alone, and Check verifies the receipt with the
// chain key instead of a signature with the role's key.
const (
	HeaderSeal  = auditchain.HeaderSeal
	SealReceipt = auditchain.SealReceipt
)

// macEncoded and sigEncoded are the lengths of a MAC and a signature in
// base64url (unpadded).
const (
	macEncoded = (sha256.Size*8 + 5) / 6
	sigEncoded = (ed25519.SignatureSize*8 + 5) / 6
)

// hopVersion prefixes the signed text of a message.
const hopVersion = "toolgate-msg-v1"

// Signer signs what one role publishes with that role's key
// (busauth.LoadHopKey): every hand-off, audit event and result a stage
// or the control service sends carries who sent it, and the next stage
// checks it with Messages.
type Signer struct {
	role   busauth.Role
	key    ed25519.PrivateKey
	pub    ed25519.PublicKey
	recent *recent  // where a checker of this process finds what it signed
	pairs  *pairs   // the hand-off MAC keys, when the roles' public keys are known
	signer []string // HeaderSigner's value, shared: a header's values are replaced, never changed in place
}

// NewSigner returns a Signer for role's key.
func NewSigner(role busauth.Role, key ed25519.PrivateKey) *Signer {
	return &Signer{role: role, key: key, pub: key.Public().(ed25519.PublicKey), signer: []string{string(role)}}
}

// NewSigner returns a Signer for role's key whose messages m, in the same
// process, accepts without verifying their signatures again. Its hand-offs
// carry a MAC for the stage they are addressed to instead of a signature
// (pairs), and m checks what is addressed to role.
func (m *Messages) NewSigner(role busauth.Role, key ed25519.PrivateKey) *Signer {
	s := NewSigner(role, key)
	s.recent = m.recent
	if m.pairs.hold(role, key) {
		s.pairs = m.pairs
	}
	return s
}

// Sign returns h (copied: a header may be shared between messages) with
// the signer's role and its signature over subject and data, or for a
// hand-off, when the signer knows the reader's public key, its MAC, or
// for a message its receipt seals (HeaderSeal), nothing more.
func (s *Signer) Sign(subject string, h nats.Header, data []byte) nats.Header {
	out := make(nats.Header, len(h)+2)
	maps.Copy(out, h)
	s.signInto(out, subject, data, true)
	return out
}

// signInto adds to h, the header of a message on subject with body data,
// what Sign adds to its copy; remember: and notes the proof for this
// process's checks (recent).
func (s *Signer) signInto(h nats.Header, subject string, data []byte, remember bool) {
	h[HeaderSigner] = s.signer
	if h.Get(HeaderSeal) == SealReceipt {
		return // its receipt signs it
	}
	var buf [signedMax]byte
	text := appendSignedMessage(buf[:0], string(s.role), subject, data)
	if k, ok := s.macKey(subject); ok {
		var sum [sha256.Size]byte
		k.sum(sum[:0], text)
		if remember {
			s.recent.addMAC(sum[:])
		}
		v := new(headerValue[[macEncoded]byte])
		base64.RawURLEncoding.Encode(v.enc[:], sum[:])
		h[HeaderMAC] = v.values()
		return
	}
	sig := ed25519.Sign(s.key, text)
	if remember {
		s.recent.add(s.pub, text, sig)
	}
	v := new(headerValue[[sigEncoded]byte])
	base64.RawURLEncoding.Encode(v.enc[:], sig)
	h[HeaderSignature] = v.values()
}

// headerValue is a header's one value and its bytes in one allocation,
// not a string and a slice: enc is written once, before values.
type headerValue[E [macEncoded]byte | [sigEncoded]byte] struct {
	enc E
	v   [1]string
}

func (v *headerValue[E]) values() []string {
	v.v[0] = unsafe.String(&v.enc[0], len(v.enc))
	return v.v[:]
}

// macKey returns the key of a hand-off on subject from s's role to the
// stage it is addressed to.
func (s *Signer) macKey(subject string) (*macKey, bool) {
	if s.pairs == nil {
		return nil, false
	}
	stage, ok := subjects.StageOfPipe(subject)
	if _, site := subjects.SiteOfPipe(subject); !ok || site {
		// A site's hand-off is read by the site's key, which the hub's
		// processes may not know yet: it is signed.
		return nil, false
	}
	return s.pairs.key(s.role, busauth.Role(stage), s.role)
}

// SignRecord signs b, a record the role stores for another to trust (a
// hook's decision): the signature covers the role and b.
func (s *Signer) SignRecord(kind string, b []byte) string {
	return base64.RawURLEncoding.EncodeToString(ed25519.Sign(s.key, signedMessage(string(s.role), kind, b)))
}

// signedMessage is the text a message signature covers: version, role and
// subject, each on its own line, then the body's SHA-256.
func signedMessage(role, subject string, data []byte) []byte {
	return appendSignedMessage(make([]byte, 0, len(hopVersion)+len(role)+len(subject)+3+sha256.Size), role, subject, data)
}

// signedMax fits the signed text of any hop (a subject is far shorter), so
// the hot path builds it on the stack; a longer one is still built.
const signedMax = 256

// appendSignedMessage appends signedMessage's text to b.
func appendSignedMessage(b []byte, role, subject string, data []byte) []byte {
	sum := sha256.Sum256(data)
	b = append(b, hopVersion...)
	b = append(b, '\n')
	b = append(b, role...)
	b = append(b, '\n')
	b = append(b, subject...)
	b = append(b, '\n')
	return append(b, sum[:]...)
}

// Messages checks who sent a message: a signature by a signing role's key
// (hops.pub), over exactly this subject and body, from a role whose rights
// let it publish on the subject. A message sent with stolen credentials but
// without the role's key, or by a role onto a subject not its own, fails.
type Messages struct {
	recent *recent
	pairs  *pairs

	chain ed25519.PublicKey // checks the receipts that seal audit's results

	mu     sync.RWMutex
	keys   map[busauth.Role]ed25519.PublicKey
	load   func() (map[busauth.Role]ed25519.PublicKey, error)
	loaded time.Time // when load last ran
}

// NewMessages returns a checker for the public keys of hops.pub. It checks
// a hand-off's MAC for the roles whose Signers it made (NewSigner).
func NewMessages(keys map[busauth.Role]ed25519.PublicKey) *Messages {
	keys = maps.Clone(keys)
	return &Messages{keys: keys, recent: newRecent(recentSize), pairs: newPairs(maps.Clone(keys))}
}

// TrustReceipts has m take a result of audit's whose receipt is its
// signature (HeaderSeal) when the receipt verifies with pub, the chain
// key's public half (audit-chain.pub). Set it before m checks messages.
func (m *Messages) TrustReceipts(pub ed25519.PublicKey) { m.chain = pub }

// LoadSitesFrom has m read hops.pub again (load) when it meets a site's
// role it has no key of: a site declared while the hub runs (toolgate
// site add) signs with a key the hub learns then. At most once a second,
// so that messages naming made-up sites cost no more than that.
func (m *Messages) LoadSitesFrom(load func() (map[busauth.Role]ed25519.PublicKey, error)) {
	m.mu.Lock()
	m.load = load
	m.mu.Unlock()
}

// key returns role's public key.
func (m *Messages) key(role busauth.Role) (ed25519.PublicKey, bool) {
	m.mu.RLock()
	k, ok := m.keys[role]
	load, last := m.load, m.loaded
	m.mu.RUnlock()
	if ok || load == nil || time.Since(last) < time.Second {
		return k, ok
	}
	if _, site := busauth.SiteOfRole(role); !site {
		return nil, false
	}
	m.reload()
	m.mu.RLock()
	defer m.mu.RUnlock()
	k, ok = m.keys[role]
	return k, ok
}

// reload reads the sites' keys again (LoadSitesFrom), at most once a
// second, and reports whether one is new or changed: a site declared
// again signs with a new key, and its old one is no longer trusted.
func (m *Messages) reload() bool {
	m.mu.Lock()
	load := m.load
	if load == nil || time.Since(m.loaded) < time.Second {
		m.mu.Unlock()
		return false
	}
	m.loaded = time.Now()
	m.mu.Unlock()
	keys, err := load()
	if err != nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	changed := false
	for r, pub := range keys {
		if _, site := busauth.SiteOfRole(r); site && !pub.Equal(m.keys[r]) {
			m.keys[r] = pub
			m.pairs.set(r, pub)
			changed = true
		}
	}
	return changed
}

// Sender returns the role that signed the message, or a permission_denied
// *api.Error (E3224) saying why the message is not one.
func (m *Messages) Sender(subject string, h nats.Header, data []byte) (busauth.Role, error) {
	role, _, err := m.Check(subject, h, data)
	return role, err
}

// Check is Sender, also reporting whether a Signer of this process made
// the signature (ours): then these are the very bytes this process
// published on subject.
func (m *Messages) Check(subject string, h nats.Header, data []byte) (role busauth.Role, ours bool, err error) {
	role, ours, err = m.check(subject, h, data)
	if _, site := busauth.SiteOfRole(busauth.Role(h.Get(HeaderSigner))); err != nil && site && m.reload() {
		// The site may have been declared again since its key was read.
		return m.check(subject, h, data)
	}
	return role, ours, err
}

func (m *Messages) check(subject string, h nats.Header, data []byte) (role busauth.Role, ours bool, err error) {
	role = busauth.Role(h.Get(HeaderSigner))
	if role == "" {
		return "", false, refuseMessage("the message carries no signature: it was not sent by a stage or the control service")
	}
	key, ok := m.key(role)
	if !ok {
		return "", false, refuseMessage("the message names signer " + string(role) + ", which has no signing key in this deployment")
	}
	if seal := h.Get(HeaderSeal); seal != "" {
		if err := m.sealed(role, seal, subject, data); err != nil {
			return "", false, err
		}
		if !busauth.MayPublish(role, subject) {
			return "", false, refuseMessage("role " + string(role) + " may not send on " + subject)
		}
		return role, false, nil
	}
	var buf [signedMax]byte
	text := appendSignedMessage(buf[:0], string(role), subject, data)
	if sum := h.Get(HeaderMAC); sum != "" {
		stage, isHop := subjects.StageOfPipe(subject)
		if !isHop {
			return "", false, refuseMessage("the message carries a MAC, which only a hand-off between stages may")
		}
		k, held := m.pairs.key(role, busauth.Role(stage), busauth.Role(stage))
		if !held {
			return "", false, refuseMessage("this process holds no key of " + stage + " to check a hand-off to it")
		}
		// The MAC is recomputed, not looked up: over the short text it
		// costs less than the look-up's own digest, and a MAC that
		// verifies binds key and text, so recent need only say whether
		// this process made it.
		var want [sha256.Size]byte
		k.sum(want[:0], text)
		var enc [macEncoded]byte
		base64.RawURLEncoding.Encode(enc[:], want[:])
		if !EqualSecret(enc[:], sum) {
			return "", false, refuseMessage("the MAC of " + string(role) + " does not verify: forged, or the message was altered")
		}
		ours = m.recent.takeMAC(want[:])
	} else {
		var raw [ed25519.SignatureSize]byte
		sig := h.Get(HeaderSignature)
		ok = len(sig) == base64.RawURLEncoding.EncodedLen(len(raw))
		if ok {
			n, err := base64.RawURLEncoding.Decode(raw[:], []byte(sig))
			ok = err == nil && n == len(raw)
		}
		if ok {
			ok, ours = m.recent.check(key, text, raw[:])
		}
		if !ok {
			return "", false, refuseMessage("the signature of " + string(role) + " does not verify: forged, or the message was altered")
		}
	}
	if !busauth.MayPublish(role, subject) {
		return "", false, refuseMessage("role " + string(role) + " may not send on " + subject)
	}
	return role, ours, nil
}

// sealed checks a message whose seal stands for its signature: only a
// result of audit's, sealed by its receipt, which the chain key signed and
// which names this message and this subject.
func (m *Messages) sealed(role busauth.Role, seal, subject string, data []byte) error {
	if role != busauth.RoleAudit || seal != SealReceipt || !subjects.IsResult(subject) {
		return refuseMessage("only audit's results are sealed by their receipt, not " + string(role) + "'s message on " + subject)
	}
	if m.chain == nil {
		return refuseMessage("this process holds no chain key to check the receipt that seals audit's result")
	}
	r, err := auditchain.OpenResult(data, m.chain)
	if err != nil {
		return err // E3960 or E3905: the receipt's own code says which
	}
	if want := subjects.Result(r.Tenant, r.Agent, r.InvocationID); want != subject {
		return refuseMessage("the receipt of " + r.InvocationID + " seals a result on " + want + ", not on " + subject)
	}
	return nil
}

// Record checks a record signature made with Signer.SignRecord by role.
func (m *Messages) Record(role busauth.Role, kind string, b []byte, sig string) bool {
	key, ok := m.key(role)
	if !ok {
		return false
	}
	raw, err := base64.RawURLEncoding.DecodeString(sig)
	return err == nil && ed25519.Verify(key, signedMessage(string(role), kind, b), raw)
}

// EqualSecret reports whether b and s are the same bytes, in time that
// depends on their lengths alone (subtle.ConstantTimeCompare, without
// copying either).
func EqualSecret[B []byte | string](b B, s string) bool {
	if len(b) != len(s) {
		return false
	}
	var v byte
	for i := range len(b) {
		v |= b[i] ^ s[i]
	}
	return subtle.ConstantTimeByteEq(v, 0) == 1
}

func refuseMessage(msg string) error {
	return api.NewError(api.PermissionDenied, api.EMessageUnsigned, "refused an unsigned or foreign message: %s", msg)
}

// SigningJetStream is js with every publish signed by s: the one place a
// role's messages get their signature, whoever in the process sends them
// (the runner, execute's events, breakers, the control service).
func SigningJetStream(js jetstream.JetStream, s *Signer) jetstream.JetStream {
	return SigningJetStreamExcept(js, s, nil)
}

// SigningJetStreamExcept is SigningJetStream leaving unsigned what goes to
// a subject for which except is true: audit's events, which the audit
// chain's signed checkpoints cover already (docs/audit.md).
func SigningJetStreamExcept(js jetstream.JetStream, s *Signer, except func(subject string) bool) jetstream.JetStream {
	if s == nil {
		return js
	}
	return &signingJS{JetStream: js, s: s, except: except}
}

type signingJS struct {
	jetstream.JetStream
	s      *Signer
	except func(subject string) bool
}

func (j *signingJS) Publish(ctx context.Context, subject string, data []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return j.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data}, opts...)
}

func (j *signingJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return j.JetStream.PublishMsg(ctx, j.signed(m), opts...)
}

func (j *signingJS) PublishAsync(subject string, data []byte, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	return j.PublishMsgAsync(&nats.Msg{Subject: subject, Data: data}, opts...)
}

func (j *signingJS) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	return j.JetStream.PublishMsgAsync(j.signed(m), opts...)
}

// PublishOwnedAsync is PublishMsgAsync for m, a message its caller made
// for this publish alone, header and all: the header is signed in place,
// not copied. Its proof is not noted for this process's checks: the
// caller is the runner, whose reader in this process takes its hand-off
// as sent (runner.Handed), and checks only one it no longer holds (a
// redelivery, a call that failed), which then costs a scan of its JSON.
// Noted, every hand-off's proof would wait in a full map to be pushed out.
func (j *signingJS) PublishOwnedAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if j.except == nil || !j.except(m.Subject) {
		if m.Header == nil {
			m.Header = make(nats.Header, 2)
		}
		j.s.signInto(m.Header, m.Subject, m.Data, false)
	}
	return PublishOwnedAsync(j.JetStream, m, opts...)
}

// OwnedPublisher is a JetStream that takes a message to publish as its
// own (PublishOwnedAsync): what it wraps it around is written in place.
type OwnedPublisher interface {
	PublishOwnedAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error)
}

// PublishOwnedAsync publishes m, a message the caller made for this
// publish alone and does not touch again, on js: in place through every
// layer that is an OwnedPublisher, copied by any other.
func PublishOwnedAsync(js jetstream.JetStream, m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if o, ok := js.(OwnedPublisher); ok {
		return o.PublishOwnedAsync(m, opts...)
	}
	return js.PublishMsgAsync(m, opts...)
}

func (j *signingJS) signed(m *nats.Msg) *nats.Msg {
	if j.except != nil && j.except(m.Subject) {
		return m
	}
	return &nats.Msg{Subject: m.Subject, Reply: m.Reply, Header: j.s.Sign(m.Subject, m.Header, m.Data), Data: m.Data}
}
