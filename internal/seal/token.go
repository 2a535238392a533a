package seal

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"

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
type Tokens struct{ key *[32]byte }

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
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(box), nil
}

// Open returns the raw token of a sealed one.
func (t *Tokens) Open(sealed string) (string, error) {
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
