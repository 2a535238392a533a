package api

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

func signed(t testing.TB, c jwt.MapClaims) string {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := jwt.NewWithClaims(jwt.SigningMethodEdDSA, c).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestReadTokenClaims(t *testing.T) {
	raw := signed(t, jwt.MapClaims{"tenant_id": "acme", "agent_did": "did:agent:a", "jti": "j1", "sub": "did:agent:a", "tenant_reader": true})
	c, err := ReadTokenClaims("  " + raw + "\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := (TokenClaims{TenantID: "acme", AgentDID: "did:agent:a", ID: "j1", Subject: "did:agent:a", TenantReader: true}); c != want {
		t.Fatalf("read %+v, want %+v", c, want)
	}
	for _, bad := range []string{"", "abc", "a.b", raw + ".x", "a.!!!.c", "a." + strings.Repeat("A", 8) + ".c"} {
		if _, err := ReadTokenClaims(bad); err == nil {
			t.Errorf("%q read as a token", bad)
		}
	}
}

// FuzzReadTokenClaims holds the reader to golang-jwt's: a token it parses
// (unverified) reads the same claims here.
func FuzzReadTokenClaims(f *testing.F) {
	f.Add(signed(f, jwt.MapClaims{"tenant_id": "acme", "agent_did": "did:agent:a", "jti": "j1"}))
	f.Add("eyJhbGciOiJFZERTQSJ9.e30.c2ln")
	f.Add("a.b.c")
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := ReadTokenClaims(raw)
		var m jwt.MapClaims
		if _, _, jerr := jwt.NewParser().ParseUnverified(strings.TrimSpace(raw), &m); jerr == nil {
			if err != nil {
				t.Fatalf("golang-jwt reads %q, ReadTokenClaims: %v", raw, err)
			}
			// golang-jwt's claims, typed as TokenClaims types them.
			var want TokenClaims
			b, _ := json.Marshal(m)
			if json.Unmarshal(b, &want) == nil && got != want {
				t.Fatalf("read %+v, golang-jwt %+v", got, want)
			}
		}
	})
}
