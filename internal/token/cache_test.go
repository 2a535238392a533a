package token

import (
	"encoding/base64"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
)

// A token seen again is accepted from the cache, within its expiry and its
// key set; past either it is verified afresh and refused as before.
func TestVerifyCache(t *testing.T) {
	k := mustKey(t, AlgEdDSA)
	raw, err := Mint(k, baseClaims(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	v := verifier(k)
	v.Now = func() time.Time { return now }

	t.Run("seen again, no parse", func(t *testing.T) {
		if _, err := v.Verify(raw); err != nil {
			t.Fatal(err)
		}
		// A parse and a signature check allocate dozens of times; a hit
		// allocates the caller's copy of the claims alone.
		if n := testing.AllocsPerRun(50, func() { _, _ = v.Verify(raw) }); n > 1 {
			t.Fatalf("a cached token costs %v allocations, as if verified afresh", n)
		}
	})
	t.Run("callers get a copy", func(t *testing.T) {
		c, err := v.Verify(raw)
		if err != nil {
			t.Fatal(err)
		}
		c.TenantID, c.ToolID = "other", Patterns{"*"}
		again, err := v.Verify(raw)
		if err != nil || again.TenantID != "acme" || len(again.ToolID) != 1 || again.ToolID[0] != "echo" {
			t.Fatalf("the cached claims changed: %+v, %v", again, err)
		}
	})
	t.Run("expired while cached", func(t *testing.T) {
		v.Now = func() time.Time { return now.Add(2 * time.Minute) }
		defer func() { v.Now = func() time.Time { return now } }()
		_, err := v.Verify(raw)
		wantCode(t, err, api.ETokenExpired)
	})
	t.Run("key set replaced", func(t *testing.T) {
		if _, err := v.Verify(raw); err != nil {
			t.Fatal(err)
		}
		v.Keys = verifier(mustKey(t, AlgEdDSA)).Keys // k is no longer trusted
		_, err := v.Verify(raw)
		wantCode(t, err, api.ETokenInvalid)
	})
	t.Run("a refusal is not cached", func(t *testing.T) {
		w := verifier(k)
		// Flip one bit of the signature itself: rewriting its last
		// characters can leave the decoded bytes unchanged.
		dot := strings.LastIndexByte(raw, '.')
		sig, err := base64.RawURLEncoding.DecodeString(raw[dot+1:])
		if err != nil {
			t.Fatal(err)
		}
		sig[0] ^= 1
		forged := raw[:dot+1] + base64.RawURLEncoding.EncodeToString(sig)
		for range 2 {
			_, err := w.Verify(forged)
			wantCode(t, err, api.ETokenInvalid)
		}
		if _, err := w.Verify(raw); err != nil {
			t.Fatal(err)
		}
	})
}

func BenchmarkVerify(b *testing.B) {
	k := mustKey(b, AlgEdDSA)
	raw, err := Mint(k, baseClaims(time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	v := verifier(k)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(raw); err != nil {
			b.Fatal(err)
		}
	}
}

// TestVerifyCacheBound: long tokens fill the cache by their length, not
// their number: past maxVerifiedBytes it starts again empty.
func TestVerifyCacheBound(t *testing.T) {
	var c verified
	ks, claims := &KeySet{}, &Claims{}
	long := strings.Repeat("x", MaxTokenBytes)
	for i := range maxVerifiedBytes/MaxTokenBytes + 1 {
		c.put(long+strconv.Itoa(i), ks, claims)
		if c.bytes > maxVerifiedBytes || len(c.m) > maxVerifiedBytes/MaxTokenBytes {
			t.Fatalf("after %d tokens the cache holds %d of them, %d bytes", i+1, len(c.m), c.bytes)
		}
	}
	if n := maxVerifiedBytes/MaxTokenBytes + 1; len(c.m) >= n {
		t.Fatalf("the cache did not start again: %d tokens of %d", len(c.m), n)
	}
}
