package seal

import (
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/sha512"
	"errors"
	"fmt"
	"hash"
	"sync"

	"filippo.io/edwards25519"
	"github.com/toolgate/toolgate/internal/busauth"
)

// HeaderMAC carries a hand-off's MAC (base64url) in place of
// HeaderSignature.
const HeaderMAC = "Toolgate-MAC"

// macVersion names the derivation of the pair keys.
const macVersion = "toolgate-hop-mac-v1"

// A hand-off (a pipeline subject) has exactly one reader, the stage it is
// addressed to, so its sender authenticates it to that role alone with an
// HMAC-SHA256 under a key only the two roles can derive: the X25519
// agreement of their hop keys (the Ed25519 keys of hops.pub, converted as
// age and libsodium convert them), through HKDF. Only the sender or the
// reader can make such a MAC, and the reader may not publish on its own
// input, so a MAC that verifies says who sent the hand-off as a signature
// does, at the price of a hash instead of a scalar multiplication. What a
// MAC does not give is proof to a third party; nothing but the reader
// checks a hand-off.
type pairs struct {
	ed   map[busauth.Role]ed25519.PublicKey // hops.pub
	pubs map[busauth.Role]*ecdh.PublicKey

	mu   sync.RWMutex
	own  map[busauth.Role]*ecdh.PrivateKey // roles whose keys this process holds
	keys map[[2]busauth.Role]*macKey       // derived, by {sender, reader}
}

// macKey is a derived pair key and the keyed HMAC states made from it:
// keying an HMAC hashes two blocks and allocates its hashes, on every hop
// and custody, so a state is kept and Reset (back to just keyed) instead.
type macKey struct {
	raw   []byte
	hmacs sync.Pool // *keyedHMAC
}

// keyedHMAC is a keyed state and the buffers it reads and writes: what a
// hash.Hash is handed escapes, so the caller's own stay on its stack.
type keyedHMAC struct {
	h    hash.Hash
	text []byte
	sum  [sha256.Size]byte
}

func newMACKey(raw []byte) *macKey {
	k := &macKey{raw: raw}
	k.hmacs.New = func() any { return &keyedHMAC{h: hmac.New(sha256.New, raw)} }
	return k
}

// sum appends the MAC of text under k to dst.
func (k *macKey) sum(dst, text []byte) []byte {
	m := k.hmacs.Get().(*keyedHMAC)
	m.text = append(m.text[:0], text...)
	m.h.Write(m.text)
	dst = append(dst, m.h.Sum(m.sum[:0])...)
	m.h.Reset()
	k.hmacs.Put(m)
	return dst
}

// equal reports whether sum is the MAC of text under k, in constant time.
func (k *macKey) equal(sum, text []byte) bool {
	var buf [sha256.Size]byte
	return hmac.Equal(sum, k.sum(buf[:0], text))
}

func newPairs(keys map[busauth.Role]ed25519.PublicKey) *pairs {
	p := &pairs{ed: keys, pubs: map[busauth.Role]*ecdh.PublicKey{}, own: map[busauth.Role]*ecdh.PrivateKey{},
		keys: map[[2]busauth.Role]*macKey{}}
	for r, k := range keys {
		// A key that is not a point has no X25519 half: its role's
		// hand-offs stay signed.
		if x, err := x25519Public(k); err == nil {
			p.pubs[r] = x
		}
	}
	return p
}

// set makes key role's public key (a site declared after the process
// started, or again), forgetting the pair keys derived from the one it
// replaces.
func (p *pairs) set(role busauth.Role, key ed25519.PublicKey) {
	x, err := x25519Public(key)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ed[role] = key
	delete(p.pubs, role)
	if err == nil {
		p.pubs[role] = x
	}
	for id := range p.keys {
		if id[0] == role || id[1] == role {
			delete(p.keys, id)
		}
	}
}

// hold adds role's private key, if it is the one hops.pub lists for role:
// the process may then MAC as role and check what is addressed to role.
// A key hops.pub does not list gets no pair keys, so what is signed with
// it fails as a signature would.
func (p *pairs) hold(role busauth.Role, key ed25519.PrivateKey) bool {
	p.mu.RLock()
	pub, ok := p.ed[role]
	hasX := p.pubs[role] != nil
	p.mu.RUnlock()
	if !ok || len(key) != ed25519.PrivateKeySize || !pub.Equal(key.Public()) || !hasX {
		return false
	}
	x, err := x25519Private(key)
	if err != nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.own[role] = x
	return true
}

// key returns the key sender and reader share, derived with whichever of
// the two private keys this process holds (held: that one); ok is false
// when it holds neither or the other's public key is unknown.
func (p *pairs) key(sender, reader busauth.Role, held busauth.Role) (*macKey, bool) {
	id := [2]busauth.Role{sender, reader}
	other := reader
	if held == reader {
		other = sender
	}
	p.mu.RLock()
	k, ok := p.keys[id]
	priv := p.own[held]
	pub := p.pubs[other]
	p.mu.RUnlock()
	if ok {
		return k, true
	}
	if priv == nil || pub == nil {
		return nil, false
	}
	raw, err := pairKey(sender, reader, priv, pub)
	if err != nil {
		return nil, false
	}
	k = newMACKey(raw)
	p.mu.Lock()
	p.keys[id] = k
	p.mu.Unlock()
	return k, true
}

// pairKey derives the MAC key of hand-offs from sender to reader.
func pairKey(sender, reader busauth.Role, priv *ecdh.PrivateKey, pub *ecdh.PublicKey) ([]byte, error) {
	shared, err := priv.ECDH(pub)
	if err != nil {
		return nil, err
	}
	return hkdf.Key(sha256.New, shared, nil, macVersion+"\n"+string(sender)+"\n"+string(reader), sha256.Size)
}

// x25519Private is the X25519 half of an Ed25519 key: the clamped scalar
// Ed25519 signs with (RFC 8032 5.1.5), which X25519 clamps again.
func x25519Private(key ed25519.PrivateKey) (*ecdh.PrivateKey, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, errors.New("not an Ed25519 private key")
	}
	h := sha512.Sum512(key.Seed())
	return ecdh.X25519().NewPrivateKey(h[:32])
}

// x25519Public is the Montgomery form of an Ed25519 public key.
func x25519Public(key ed25519.PublicKey) (*ecdh.PublicKey, error) {
	pt, err := new(edwards25519.Point).SetBytes(key)
	if err != nil {
		return nil, fmt.Errorf("not an Ed25519 public key: %w", err)
	}
	return ecdh.X25519().NewPublicKey(pt.BytesMontgomery())
}

// mac is the MAC of text under key.
func mac(key *macKey, text []byte) []byte { return key.sum(nil, text) }
