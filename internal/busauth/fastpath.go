package busauth

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"sync"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/nacl/box"
)

// What a CONNECT costs the callout, and what is cached so it costs less
// (BenchmarkHandle): the curve25519 key the callout shares with a server
// is computed once per server instead of twice per request (opening the
// request, sealing the answer), and a worker's or operator's user JWT,
// which is the same on every connect, is verified once. Per connect there
// remain the verification of the server's signed request, the proof of
// the nkey (nonce signature) or the capability token, and the two
// signatures of the answer (the user and the response), which name the
// connection's own nkey and so cannot be reused.

// xkeyVersion is nkeys' header of sealed messages (nkeys.XKeyVersionV1).
var xkeyVersion = []byte(nkeys.XKeyVersionV1)

const xkeyNonceLen = 24

// sharedKeys caches the precomputed box key per server xkey.
type sharedKeys struct {
	priv [32]byte
	mu   sync.Mutex
	keys map[string]*[32]byte
}

// maxCached bounds the caches: servers of a cluster and the issued
// credentials in use are few; past the bound a cache starts again empty.
const maxCached = 1024

func newSharedKeys(kp nkeys.KeyPair) (*sharedKeys, error) {
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	pfx, raw, err := nkeys.DecodeSeed(seed)
	if err != nil || pfx != nkeys.PrefixByteCurve || len(raw) != 32 {
		return nil, errors.New("busauth: xkey is not a curve key")
	}
	s := &sharedKeys{keys: map[string]*[32]byte{}}
	copy(s.priv[:], raw)
	return s, nil
}

func (s *sharedKeys) shared(peer string) (*[32]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k, ok := s.keys[peer]; ok {
		return k, nil
	}
	raw, err := nkeys.Decode(nkeys.PrefixByteCurve, []byte(peer))
	if err != nil || len(raw) != 32 {
		return nil, nkeys.ErrInvalidSender
	}
	var pub [32]byte
	copy(pub[:], raw)
	k := new([32]byte)
	box.Precompute(k, &pub, &s.priv)
	if len(s.keys) >= maxCached {
		clear(s.keys)
	}
	s.keys[peer] = k
	return k, nil
}

// open is nkeys' Open of a message peer sealed to us.
func (s *sharedKeys) open(in []byte, peer string) ([]byte, error) {
	if len(in) <= len(xkeyVersion)+xkeyNonceLen || !bytes.Equal(in[:len(xkeyVersion)], xkeyVersion) {
		return nil, nkeys.ErrInvalidEncrypted
	}
	k, err := s.shared(peer)
	if err != nil {
		return nil, err
	}
	var nonce [xkeyNonceLen]byte
	copy(nonce[:], in[len(xkeyVersion):])
	out, ok := box.OpenAfterPrecomputation(nil, in[len(xkeyVersion)+xkeyNonceLen:], &nonce, k)
	if !ok {
		return nil, nkeys.ErrCouldNotDecrypt
	}
	return out, nil
}

// seal is nkeys' Seal of msg to peer.
func (s *sharedKeys) seal(msg []byte, peer string) ([]byte, error) {
	k, err := s.shared(peer)
	if err != nil {
		return nil, err
	}
	var nonce [xkeyNonceLen]byte
	if _, err := io.ReadFull(rand.Reader, nonce[:]); err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(xkeyVersion)+xkeyNonceLen+len(msg)+box.Overhead)
	out = append(append(out, xkeyVersion...), nonce[:]...)
	return box.SealAfterPrecomputation(out, msg, &nonce, k), nil
}

// userClaimsCache remembers issued user JWTs whose signature verified.
type userClaimsCache struct {
	mu sync.Mutex
	m  map[string]*jwt.UserClaims
}

// decode is jwt.DecodeUserClaims, verifying a given JWT's signature once.
// The claims returned are shared: callers must not change them.
func (c *userClaimsCache) decode(tok string) (*jwt.UserClaims, error) {
	c.mu.Lock()
	uc, ok := c.m[tok]
	c.mu.Unlock()
	if ok {
		return uc, nil
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCached {
		c.m = map[string]*jwt.UserClaims{}
	}
	c.m[tok] = uc
	c.mu.Unlock()
	return uc, nil
}

// presigner is an nkeys.KeyPair whose Sign uses an ed25519 key expanded
// once: nkeys' own key pair expands its seed on every signature, which is
// a quarter of what a CONNECT costs the callout (it signs twice).
type presigner struct {
	nkeys.KeyPair
	priv ed25519.PrivateKey
}

func newPresigner(kp nkeys.KeyPair) (nkeys.KeyPair, error) {
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	_, raw, err := nkeys.DecodeSeed(seed)
	if err != nil || len(raw) != ed25519.SeedSize {
		return nil, errors.New("busauth: signing key is not an ed25519 nkey")
	}
	return presigner{KeyPair: kp, priv: ed25519.NewKeyFromSeed(raw)}, nil
}

// Sign implements nkeys.KeyPair.
func (p presigner) Sign(input []byte) ([]byte, error) { return ed25519.Sign(p.priv, input), nil }
