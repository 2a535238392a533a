package token

import (
	"sync"
	"time"
)

// What a verification costs, and what is cached so it costs less: an agent
// presents the same token on every call of its session, and parsing it and
// checking its signature (an Ed25519 verification, some 50µs) is most of
// what authorize spends on a call. A Verifier remembers the claims of the
// tokens that verified, keyed by the whole raw token (a map's hash of it
// costs a fraction of a digest, and an equal key is the very token), and a
// token seen again is accepted without parsing while
//   - the key set is the one that verified it (a rotated or reloaded set
//     verifies every token afresh), and
//   - it is unexpired at the time of the call (past its exp, with the
//     leeway, it is verified again, which says why it is refused).
// Everything else Verify checks does not change with time: the signature,
// issuer, audience, header, claim forms, and not-before and issued-at,
// which passed once and stay passed as the clock moves on. Revocation is
// not Verify's to check: callers look it up on every call. Refused tokens
// are never cached.

// maxVerified and maxVerifiedBytes bound the tokens remembered and their
// length; past either the cache starts again empty, so a flood of distinct
// tokens costs what it cost without a cache.
const (
	maxVerified      = 4096
	maxVerifiedBytes = 8 << 20
)

type verified struct {
	mu    sync.Mutex
	m     map[string]verifiedToken
	bytes int // the keys' length
}

type verifiedToken struct {
	keys   *KeySet
	claims *Claims
}

// get returns a copy of the claims of raw, verified by keys and unexpired
// at now, or nil.
func (c *verified) get(raw string, keys *KeySet, now time.Time, leeway time.Duration) *Claims {
	c.mu.Lock()
	e, ok := c.m[raw]
	c.mu.Unlock()
	if !ok || e.keys != keys || e.claims.ExpiresAt == nil || !now.Before(e.claims.ExpiresAt.Add(leeway)) {
		return nil
	}
	claims := *e.claims // callers may change their copy, not the cached one
	return &claims
}

func (c *verified) put(raw string, keys *KeySet, claims *Claims) {
	cp := *claims
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxVerified || c.bytes+len(raw) > maxVerifiedBytes {
		c.m, c.bytes = make(map[string]verifiedToken), 0
	}
	if _, ok := c.m[raw]; !ok {
		c.bytes += len(raw)
	}
	c.m[raw] = verifiedToken{keys: keys, claims: &cp}
	c.mu.Unlock()
}
