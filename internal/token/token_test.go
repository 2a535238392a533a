package token

import (
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/toolgate/toolgate/api"
)

const (
	testIssuer   = "toolgate-test"
	testAudience = "toolgate"
)

func mustKey(t testing.TB, alg string) *SigningKey {
	t.Helper()
	k, err := GenerateSigningKey(alg)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func baseClaims(ttl time.Duration) Claims {
	now := time.Now()
	return Claims{
		ToolID: Patterns{"echo"}, AgentDID: "did:agent:a", TenantID: "acme",
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer: testIssuer, Audience: jwt.ClaimStrings{testAudience},
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
		},
	}
}

func verifier(keys ...*SigningKey) *Verifier {
	ks := &KeySet{keys: map[string]verificationKey{}}
	for _, k := range keys {
		ks.keys[k.KID] = verificationKey{alg: k.Alg, key: k.Key.Public()}
	}
	return &Verifier{Keys: StaticKeys{ks}, Issuer: testIssuer, Audience: testAudience}
}

func wantCode(t *testing.T, err error, ecode string) {
	t.Helper()
	var te *api.Error
	if !errors.As(err, &te) || te.ECode != ecode {
		t.Fatalf("got %v, want %s", err, ecode)
	}
}

func TestVerifyAcceptsBothAlgorithms(t *testing.T) {
	for _, alg := range Algorithms {
		k := mustKey(t, alg)
		raw, err := Mint(k, baseClaims(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		c, err := verifier(k).Verify(raw)
		if err != nil || c.TenantID != "acme" || !c.ToolID.Match("echo") || c.ID == "" {
			t.Fatalf("%s: %+v, %v", alg, c, err)
		}
	}
}

// TestVerifyRefusesAttacks: each forged or unusable token is refused with
// its code.
func TestVerifyRefusesAttacks(t *testing.T) {
	rsaKey := mustKey(t, AlgRS256)
	edKey := mustKey(t, AlgEdDSA)
	v := verifier(rsaKey, edKey)
	good, err := Mint(rsaKey, baseClaims(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(good, ".")
	b64 := base64.RawURLEncoding.EncodeToString

	// alg none: header says none, no signature.
	noneTok := jwt.NewWithClaims(jwt.SigningMethodNone, baseClaims(time.Minute))
	noneTok.Header["kid"] = rsaKey.KID
	none, _ := noneTok.SignedString(jwt.UnsafeAllowNoneSignatureType)

	// HS256 keyed with the RSA public key's PEM: the classic key confusion.
	pubDER, _ := x509.MarshalPKIXPublicKey(rsaKey.Key.Public().(*rsa.PublicKey))
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	hsTok := jwt.NewWithClaims(jwt.SigningMethodHS256, baseClaims(time.Minute))
	hsTok.Header["kid"] = rsaKey.KID
	hs, _ := hsTok.SignedString(pubPEM)

	// An EdDSA token claiming the RSA key's kid.
	swapTok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, baseClaims(time.Minute))
	swapTok.Header["kid"] = rsaKey.KID
	swapped, _ := swapTok.SignedString(edKey.Key)

	stranger := mustKey(t, AlgEdDSA)
	unknownKid, _ := Mint(stranger, baseClaims(time.Minute))

	expired, _ := Mint(rsaKey, baseClaims(-time.Minute))
	early := baseClaims(time.Hour)
	early.NotBefore = jwt.NewNumericDate(time.Now().Add(30 * time.Minute))
	notYet, _ := Mint(rsaKey, early)

	// Tampered payload: another tenant, the original signature.
	tamperedPayload := b64([]byte(strings.Replace(mustDecode(t, parts[1]), `"acme"`, `"other"`, 1)))
	tampered := parts[0] + "." + tamperedPayload + "." + parts[2]

	wrongIss := baseClaims(time.Minute)
	wrongIss.Issuer = "someone-else"
	badIss, _ := Mint(rsaKey, wrongIss)
	wrongAud := baseClaims(time.Minute)
	wrongAud.Audience = jwt.ClaimStrings{"other-service"}
	badAud, _ := Mint(rsaKey, wrongAud)

	noExp := baseClaims(time.Minute)
	noExp.ExpiresAt = nil
	noExpTok := jwt.NewWithClaims(jwt.SigningMethodRS256, noExp)
	noExpTok.Header["kid"] = rsaKey.KID
	noExpRaw, _ := noExpTok.SignedString(rsaKey.Key)

	noAgent := baseClaims(time.Minute)
	noAgent.AgentDID = ""
	noAgent.ID = "x"
	noAgentTok := jwt.NewWithClaims(jwt.SigningMethodRS256, noAgent)
	noAgentTok.Header["kid"] = rsaKey.KID
	noAgentRaw, _ := noAgentTok.SignedString(rsaKey.Key)

	cases := []struct {
		name, raw, code string
	}{
		{"alg none", none, api.ETokenInvalid},
		{"HS256 keyed with the RSA public key", hs, api.ETokenInvalid},
		{"algorithm swapped under a kid", swapped, api.ETokenInvalid},
		{"unknown kid", unknownKid, api.ETokenInvalid},
		{"expired", expired, api.ETokenExpired},
		{"not yet valid", notYet, api.ETokenInvalid},
		{"tampered payload", tampered, api.ETokenInvalid},
		{"wrong issuer", badIss, api.ETokenInvalid},
		{"wrong audience", badAud, api.ETokenInvalid},
		{"no expiry", noExpRaw, api.ETokenClaims},
		{"no agent", noAgentRaw, api.ETokenClaims},
		{"empty", "", api.ETokenInvalid},
		{"garbage", "a.b.c", api.ETokenInvalid},
		{"huge", strings.Repeat("a", MaxTokenBytes+1), api.ETokenInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := v.Verify(tc.raw)
			wantCode(t, err, tc.code)
		})
	}
}

func mustDecode(t *testing.T, s string) string {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestGrants(t *testing.T) {
	c := baseClaims(time.Minute)
	c.ToolID = Patterns{"fs.*", "echo"}
	c.ToolVersion = "^2"
	ok := Binding{Tenant: "acme", AgentDID: "did:agent:a", ToolID: "echo", ToolVersion: "2.1.0"}
	if err := c.Grants(ok); err != nil {
		t.Fatal(err)
	}
	if err := c.Grants(Binding{Tenant: "acme", AgentDID: "did:agent:a", ToolID: "fs.read_file", ToolVersion: "2.0.0"}); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]Binding{
		"other tenant":  {Tenant: "evil", AgentDID: "did:agent:a", ToolID: "echo", ToolVersion: "2.0.0"},
		"other agent":   {Tenant: "acme", AgentDID: "did:agent:b", ToolID: "echo", ToolVersion: "2.0.0"},
		"other tool":    {Tenant: "acme", AgentDID: "did:agent:a", ToolID: "sleep", ToolVersion: "2.0.0"},
		"version":       {Tenant: "acme", AgentDID: "did:agent:a", ToolID: "echo", ToolVersion: "1.0.0"},
		"prefix trick":  {Tenant: "acme", AgentDID: "did:agent:a", ToolID: "fsx.read", ToolVersion: "2.0.0"},
		"slash in tool": {Tenant: "acme", AgentDID: "did:agent:a", ToolID: "fs.a/b", ToolVersion: "2.0.0"},
	} {
		err := c.Grants(b)
		var te *api.Error
		if !errors.As(err, &te) || te.ECode != api.ENotGranted {
			t.Errorf("%s: %v, want E3210", name, err)
		}
	}
}

func TestAttenuation(t *testing.T) {
	parent := baseClaims(time.Hour)
	parent.ID = "root"
	parent.ToolID = Patterns{"fs.*", "echo"}
	parent.Filesystem = &FilesystemGrant{AllowedPaths: []string{"/data"}, Mode: "rw"}
	parent.Network = &NetworkGrant{AllowedHosts: []string{"*.example.com"}, AllowedPorts: []int{443}}
	parent.Credentials = &CredentialGrant{AllowedSecrets: []string{"a", "b"}}
	parent.Budget = &Budget{MaxCalls: 10, MaxCost: 1}
	parent.ExcludedSideEffects = []string{"payments"}

	child, err := Attenuate(&parent, Claims{
		ToolID:      Patterns{"fs.read_*"},
		Filesystem:  &FilesystemGrant{AllowedPaths: []string{"/data/reports"}},
		Network:     &NetworkGrant{AllowedHosts: []string{"api.example.com"}},
		Credentials: &CredentialGrant{AllowedSecrets: []string{"a"}},
		Budget:      &Budget{MaxCalls: 3},
		RegisteredClaims: jwt.RegisteredClaims{
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(10 * time.Minute)),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if child.TenantID != "acme" || child.Filesystem.Mode != "ro" || child.Budget.MaxCalls != 3 || child.Budget.MaxCost != 1 ||
		len(child.Chain) != 1 || child.Chain[0] != "root" || child.Network.AllowedPorts[0] != 443 ||
		len(child.ExcludedSideEffects) != 1 {
		t.Fatalf("child %+v", child)
	}
	grandchild, err := Attenuate(&child, Claims{ToolID: Patterns{"fs.read_file"}})
	if err != nil || len(grandchild.Chain) != 2 || grandchild.Filesystem.AllowedPaths[0] != "/data/reports" {
		t.Fatalf("grandchild %+v, %v", grandchild, err)
	}

	widen := map[string]Claims{
		"more tools":        {ToolID: Patterns{"*"}},
		"sibling tool":      {ToolID: Patterns{"sleep"}},
		"path outside":      {Filesystem: &FilesystemGrant{AllowedPaths: []string{"/data_evil"}}},
		"path by ..":        {Filesystem: &FilesystemGrant{AllowedPaths: []string{"/data/../etc"}}},
		"host outside":      {Network: &NetworkGrant{AllowedHosts: []string{"example.org"}}},
		"other port":        {Network: &NetworkGrant{AllowedHosts: []string{"api.example.com"}, AllowedPorts: []int{22}}},
		"new secret":        {Credentials: &CredentialGrant{AllowedSecrets: []string{"c"}}},
		"larger budget":     {Budget: &Budget{MaxCalls: 11}},
		"larger cost":       {Budget: &Budget{MaxCost: 2}},
		"later expiry":      {RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(time.Now().Add(2 * time.Hour))}},
		"other tenant":      {TenantID: "evil"},
		"pre-approval":      {PreApproved: Patterns{"echo"}},
		"question wildcard": {ToolID: Patterns{"fs.?"}},
	}
	for name, want := range widen {
		_, err := Attenuate(&parent, want)
		if err == nil {
			t.Errorf("%s: child accepted", name)
			continue
		}
		var te *api.Error
		if errors.As(err, &te) && te.ECode != api.EAttenuationWidens {
			t.Errorf("%s: %v, want E3216", name, err)
		}
	}
	// A read-only parent cannot have a writing child.
	ro := parent
	ro.Filesystem = &FilesystemGrant{AllowedPaths: []string{"/data"}}
	if _, err := Attenuate(&ro, Claims{Filesystem: &FilesystemGrant{AllowedPaths: []string{"/data"}, Mode: "rw"}}); err == nil {
		t.Error("rw child of an ro parent accepted")
	}
	// Narrowing the version range keeps both constraints.
	parent.ToolVersion = "^1"
	vc, err := Attenuate(&parent, Claims{ToolVersion: "<1.5"})
	if err != nil {
		t.Fatal(err)
	}
	b := Binding{Tenant: "acme", AgentDID: "did:agent:a", ToolID: "echo"}
	b.ToolVersion = "1.4.0"
	if err := vc.Grants(b); err != nil {
		t.Fatal(err)
	}
	b.ToolVersion = "1.6.0"
	if vc.Grants(b) == nil {
		t.Fatal("child range not applied")
	}
	b.ToolVersion = "0.9.0"
	if vc.Grants(b) == nil {
		t.Fatal("parent range not applied")
	}
}

func TestPatternContainment(t *testing.T) {
	for _, tc := range []struct {
		parent, child string
		want          bool
	}{
		{"*", "anything", true},
		{"fs.*", "fs.read_*", true},
		{"fs.*", "fs.*", true},
		{"fs.*", "*", false},
		{"f*", "fs.*", true},
		{"*x*", "*x", true},
		{"a*", "*a", false},
		{"mcp:fs:*", "mcp:fs:read_file", true},
		{"mcp:fs:*", "mcp:fsx:read", false},
	} {
		if got := (Patterns{tc.parent}).Match(tc.child); got != tc.want {
			t.Errorf("%q covers %q = %v, want %v", tc.parent, tc.child, got, tc.want)
		}
	}
}

func TestKeyFileReloads(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "jwks.json")
	k1, k2 := mustKey(t, AlgEdDSA), mustKey(t, AlgRS256)
	write := func(k *SigningKey) {
		b, err := k.PublicJWKS()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(k1)
	kf, err := OpenKeyFile(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	v := &Verifier{Keys: kf, Issuer: testIssuer, Audience: testAudience}
	raw2, _ := Mint(k2, baseClaims(time.Minute))
	if _, err := v.Verify(raw2); err == nil {
		t.Fatal("key 2 accepted before it was published")
	}
	write(k2)
	if err := kf.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(raw2); err != nil {
		t.Fatal(err)
	}
	// A broken file keeps the last good set.
	if err := os.WriteFile(path, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if kf.Reload() == nil {
		t.Fatal("broken key set loaded")
	}
	if _, err := v.Verify(raw2); err != nil {
		t.Fatal(err)
	}
}

func TestKeySetRefusesBadKeys(t *testing.T) {
	k := mustKey(t, AlgEdDSA)
	priv, _ := k.MarshalPrivate()
	if _, err := ParseKeySet([]byte(`{"keys":[` + string(priv) + `]}`)); err == nil {
		t.Fatal("private key accepted in a key set")
	}
	pub, _ := k.PublicJWKS()
	noAlg := strings.Replace(string(pub), `"alg": "EdDSA",`, "", 1)
	if _, err := ParseKeySet([]byte(noAlg)); err == nil {
		t.Fatal("key without alg accepted")
	}
	wrongAlg := strings.Replace(string(pub), `"alg": "EdDSA"`, `"alg": "RS256"`, 1)
	if _, err := ParseKeySet([]byte(wrongAlg)); err == nil {
		t.Fatal("Ed25519 key labelled RS256 accepted")
	}
	back, err := ParseSigningKey(priv)
	if err != nil || back.KID != k.KID {
		t.Fatalf("signing key round trip: %v", err)
	}
}

// FuzzVerify: no input makes Verify panic or accept an unsigned token.
func FuzzVerify(f *testing.F) {
	k := mustKey(f, AlgEdDSA)
	good, _ := Mint(k, baseClaims(time.Hour))
	f.Add(good)
	f.Add("eyJhbGciOiJub25lIn0.e30.")
	f.Add("a.b.c")
	v := verifier(k)
	f.Fuzz(func(t *testing.T, raw string) {
		c, err := v.Verify(raw)
		if err == nil && raw != good {
			// Only a token signed by k verifies; mutations of good that still
			// verify must decode to the same claims (base64 padding slack).
			if c.TenantID != "acme" || c.AgentDID != "did:agent:a" {
				t.Fatalf("accepted %q as %+v", raw, c)
			}
		}
	})
}

// TestMintRefusesTokensTooLargeToConnect: a token an agent could not
// connect with is refused at mint, with what to do about it; a smaller
// one is minted.
func TestMintRefusesTokensTooLargeToConnect(t *testing.T) {
	k := mustKey(t, AlgEdDSA)
	c := baseClaims(time.Hour)
	for i := range 200 {
		c.ToolID = append(c.ToolID, fmt.Sprintf("tool.number.%03d", i))
	}
	_, err := Mint(k, c)
	if err == nil || !strings.Contains(err.Error(), "grant fewer") {
		t.Fatalf("mint of a %d-tool token: %v, want a refusal saying what to do", len(c.ToolID), err)
	}
	c.ToolID = c.ToolID[:80]
	raw, err := Mint(k, c)
	if err != nil {
		t.Fatalf("mint of an 80-tool token: %v", err)
	}
	if len(raw) > MaxConnectTokenBytes {
		t.Fatalf("minted %d bytes", len(raw))
	}
}
