package seal

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"sync"

	"golang.org/x/crypto/nacl/secretbox"
)

// TokenPrefix starts a sealed capability token: what validate hands
// authorize in place of the raw token, so no other role reads a credential
// an agent could reuse, on the pipeline (which every stage's sweep may
// read) or in the parked call of an approval.
const TokenPrefix = "tgsealed1."

// ErrTokenSeal reports a sealed token that does not open with this
// deployment's token key.
var ErrTokenSeal = errors.New("the sealed capability token does not open with this deployment's token key")

// Tokens seals and opens capability tokens with the deployment's token
// key (busauth.LoadTokenKey), held by validate and authorize only.
//
// Where validate and authorize share a process (serve), authorize opens
// what validate sealed a moment before: Tokens remembers what it sealed,
// by the whole sealed text, so that Open finds the token without
// decrypting it again. Only an exact match is found, which is the token
// decryption would give; anything else, a redelivery included (a sealed
// token is forgotten once opened), is opened the long way.
type Tokens struct {
	key            *[32]byte
	memory[string] // sealed → raw, sealed by this process and not yet opened
}

// memory remembers what this process made, by its exact bytes, until it
// is taken once: a check of what the process made itself is answered
// from it, anything else (a redelivery included) the long way.
type memory[V any] struct {
	mu    sync.Mutex
	made  map[string]kept[V]
	bytes int // the sum of made's lengths
}

// kept is a value remembered and its length with its key's.
type kept[V any] struct {
	v V
	n int
}

// maxMade and maxMadeBytes bound what a memory holds (made and never
// taken here: the reader runs elsewhere, or the call was refused before
// it); past either the memory starts again empty.
const (
	maxMade      = 4096
	maxMadeBytes = 8 << 20
)

// NewTokens returns Tokens for key.
func NewTokens(key *[32]byte) *Tokens { return &Tokens{key: key} }

// Seal returns raw sealed; an empty token stays empty.
func (t *Tokens) Seal(raw string) (string, error) {
	if raw == "" || IsSealedToken(raw) {
		return raw, nil
	}
	// One buffer holds the nonce, the box after it, and the raw token
	// past the box's end (Seal's message must not overlap its output);
	// the text is written once, after the prefix.
	n := len(raw)
	buf := make([]byte, 24+secretbox.Overhead+n+n)
	var nonce [24]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return "", err
	}
	msg := buf[24+secretbox.Overhead+n:]
	copy(msg, raw)
	box := secretbox.Seal(append(buf[:0], nonce[:]...), msg, &nonce, t.key)
	text := make([]byte, len(TokenPrefix)+base64.RawURLEncoding.EncodedLen(len(box)))
	base64.RawURLEncoding.Encode(text[copy(text, TokenPrefix):], box)
	sealed := string(text)
	clear(msg)
	t.remember(sealed, raw, len(sealed)+len(raw))
	return sealed, nil
}

// remember records v under k, n bytes long with k.
func (m *memory[V]) remember(k string, v V, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.made == nil || len(m.made) >= maxMade || m.bytes+n > maxMadeBytes {
		m.made, m.bytes = make(map[string]kept[V]), 0
	}
	m.made[k] = kept[V]{v, n}
	m.bytes += n
}

// take returns what was remembered under k, forgetting it, if anything
// was.
func (m *memory[V]) take(k string) (V, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.made[k]
	if ok {
		delete(m.made, k)
		m.bytes -= e.n
	}
	return e.v, ok
}

// Open returns the raw token of a sealed one.
func (t *Tokens) Open(sealed string) (string, error) {
	if raw, ok := t.take(sealed); ok {
		return raw, nil
	}
	b64, ok := strings.CutPrefix(sealed, TokenPrefix)
	if !ok {
		return "", ErrTokenSeal
	}
	box, err := base64.RawURLEncoding.DecodeString(b64)
	if err != nil || len(box) < 24+secretbox.Overhead {
		return "", ErrTokenSeal
	}
	var nonce [24]byte
	copy(nonce[:], box)
	raw, ok := secretbox.Open(nil, box[24:], &nonce, t.key)
	if !ok {
		return "", ErrTokenSeal
	}
	return string(raw), nil
}

// IsSealedToken reports whether s is a sealed token.
func IsSealedToken(s string) bool { return strings.HasPrefix(s, TokenPrefix) }
