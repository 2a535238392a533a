package token

import (
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
)

// refreshing is a Refresher whose fetch returns next, counting fetches.
type refreshing struct {
	cur, next *KeySet
	fetches   []string
}

func (r *refreshing) KeySet() *KeySet { return r.cur }

func (r *refreshing) Refresh(kid string) *KeySet {
	r.fetches = append(r.fetches, kid)
	r.cur = r.next
	return r.cur
}

// TestVerifyRefreshesOnUnknownKid: a token of a key rotated in since the
// set was fetched verifies once the source fetches again; a known kid
// fetches nothing; a kid the fresh set lacks stays refused (E3201); the
// JWKS a set publishes reads back as the same keys.
func TestVerifyRefreshesOnUnknownKid(t *testing.T) {
	old, rotated, forger := mustKey(t, AlgEdDSA), mustKey(t, AlgRS256), mustKey(t, AlgEdDSA)
	both := verifier(old, rotated).Keys.KeySet()
	src := &refreshing{cur: verifier(old).Keys.KeySet(), next: both}
	v := &Verifier{Keys: src, Issuer: testIssuer, Audience: testAudience}
	mint := func(k *SigningKey) string {
		raw, err := Mint(k, baseClaims(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	if _, err := v.Verify(mint(old)); err != nil || len(src.fetches) != 0 {
		t.Fatalf("known kid: %v, fetches %v", err, src.fetches)
	}
	if _, err := v.Verify(mint(rotated)); err != nil {
		t.Fatalf("a rotated-in key: %v", err)
	}
	if len(src.fetches) != 1 || src.fetches[0] != rotated.KID {
		t.Fatalf("fetches %v, want one for %s", src.fetches, rotated.KID)
	}
	_, err := v.Verify(mint(forger))
	wantCode(t, err, api.ETokenInvalid)

	b, err := both.JWKS()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseKeySet(b)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if back.Fingerprint() != both.Fingerprint() {
		t.Fatalf("JWKS round trip changed the keys:\n%s", b)
	}
}
