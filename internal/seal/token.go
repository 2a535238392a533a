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
	key *[32]byte

	mu    sync.Mutex
	made  map[string]string // sealed → raw, sealed by this process and not yet opened
	bytes int               // the length of made's keys and values
}

// maxMade and maxMadeBytes bound the sealed tokens remembered (sealed and
// never opened here: authorize runs elsewhere, or validate refused the
// call); past either the memory starts again empty.
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
	var nonce [24]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return "", err
	}
	box := secretbox.Seal(nonce[:], []byte(raw), &nonce, t.key)
	sealed := TokenPrefix + base64.RawURLEncoding.EncodeToString(box)
	t.remember(sealed, raw)
	return sealed, nil
}

// remember records that raw sealed is sealed.
func (t *Tokens) remember(sealed, raw string) {
	n := len(sealed) + len(raw)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.made == nil || len(t.made) >= maxMade || t.bytes+n > maxMadeBytes {
		t.made, t.bytes = make(map[string]string), 0
	}
	t.made[sealed] = raw
	t.bytes += n
}

// taken returns the raw token this process sealed as sealed, forgetting
// it, if it did.
func (t *Tokens) taken(sealed string) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	raw, ok := t.made[sealed]
	if ok {
		delete(t.made, sealed)
		t.bytes -= len(sealed) + len(raw)
	}
	return raw, ok
}

// Open returns the raw token of a sealed one.
func (t *Tokens) Open(sealed string) (string, error) {
	if raw, ok := t.taken(sealed); ok {
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
