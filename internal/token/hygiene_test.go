package token

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/toolgate/toolgate/api"
)

// craft signs a hand-written header and payload with k, so that a test can
// put into a token what Mint never would.
func craft(t *testing.T, k *SigningKey, header map[string]any, payload string) string {
	t.Helper()
	h := map[string]any{"alg": k.Alg, "kid": k.KID}
	for name, v := range header {
		if v == nil {
			delete(h, name)
		} else {
			h[name] = v
		}
	}
	hb, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.RawURLEncoding.EncodeToString
	signing := b64(hb) + "." + b64([]byte(payload))
	sig, err := k.method().Sign(signing, k.Key)
	if err != nil {
		t.Fatal(err)
	}
	return signing + "." + b64(sig)
}

// payload writes claims the verifier accepts, with exp, iat and extra
// fields as given (raw JSON fragments).
func payload(exp, iat, extra string) string {
	p := fmt.Sprintf(`{"tool_id":"echo","agent_did":"did:agent:a","tenant_id":"acme","jti":"j1","iss":%q,"aud":%q`, testIssuer, testAudience)
	if exp != "" {
		p += `,"exp":` + exp
	}
	if iat != "" {
		p += `,"iat":` + iat
	}
	return p + extra + "}"
}

// TestVerifyHygiene: header and registered-claim forms RFC 7515 §4.1.11 and
// RFC 8725 §3.11 ask a verifier to refuse, next to the forms it accepts.
func TestVerifyHygiene(t *testing.T) {
	k := mustKey(t, AlgEdDSA)
	v := verifier(k)
	now := time.Now().Unix()
	exp := fmt.Sprint(now + 600)
	iat := fmt.Sprint(now)
	ok := payload(exp, iat, "")

	cases := []struct {
		name   string
		header map[string]any
		claims string
		code   string // "" accepts
	}{
		{"plain", nil, ok, ""},
		{"typ JWT", map[string]any{"typ": "JWT"}, ok, ""},
		{"typ absent", map[string]any{"typ": nil}, ok, ""},
		{"typ at+jwt", map[string]any{"typ": "at+jwt"}, ok, ""},
		{"typ application/at+JWT", map[string]any{"typ": "application/at+JWT"}, ok, ""},
		{"typ of an ID token", map[string]any{"typ": "id_token+jwt"}, ok, api.ETokenInvalid},
		{"typ of a logout token", map[string]any{"typ": "logout+jwt"}, ok, api.ETokenInvalid},
		{"typ JOSE", map[string]any{"typ": "JOSE"}, ok, api.ETokenInvalid},
		{"typ not a string", map[string]any{"typ": 7}, ok, api.ETokenInvalid},
		{"crit unknown extension", map[string]any{"crit": []string{"exp-ext"}, "exp-ext": true}, ok, api.ETokenInvalid},
		{"crit b64", map[string]any{"crit": []string{"b64"}, "b64": false}, ok, api.ETokenInvalid},
		{"crit empty", map[string]any{"crit": []string{}}, ok, api.ETokenInvalid},
		{"exp as a string", nil, payload(`"`+exp+`"`, iat, ""), api.ETokenInvalid},
		{"iat as a string", nil, payload(exp, `"`+iat+`"`, ""), api.ETokenInvalid},
		{"nbf as a string", nil, payload(exp, iat, `,"nbf":"`+iat+`"`), api.ETokenInvalid},
		{"exp fractional", nil, payload(exp+".5", iat, ""), ""},
		{"no exp", nil, payload("", iat, ""), api.ETokenClaims},
		{"lifetime a year", nil, payload(fmt.Sprint(now+365*86400), iat, ""), api.ETokenInvalid},
		{"lifetime a day and an hour", nil, payload(fmt.Sprint(now+25*3600), iat, ""), api.ETokenInvalid},
		{"lifetime a year, no iat", nil, payload(fmt.Sprint(now+365*86400), "", ""), api.ETokenInvalid},
		{"lifetime a year, iat backdated", nil, payload(exp, fmt.Sprint(now-365*86400), ""), api.ETokenInvalid},
		{"lifetime a day", nil, payload(fmt.Sprint(now+86400), iat, ""), ""},
		{"no aud", nil, fmt.Sprintf(`{"tool_id":"echo","agent_did":"did:agent:a","tenant_id":"acme","jti":"j1","iss":%q,"exp":%s,"iat":%s}`, testIssuer, exp, iat), api.ETokenClaims},
		{"empty aud", nil, payload(exp, iat, "")[:len(ok)-1] + `,"aud":[]}`, api.ETokenClaims},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := v.Verify(craft(t, k, tc.header, tc.claims))
			if tc.code == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			wantCode(t, err, tc.code)
		})
	}
}

func TestVerifyMaxLifetimeSetting(t *testing.T) {
	k := mustKey(t, AlgEdDSA)
	v := verifier(k)
	v.MaxLifetime = 10 * time.Minute
	if _, err := v.Verify(craft(t, k, nil, payload(fmt.Sprint(time.Now().Unix()+3600), fmt.Sprint(time.Now().Unix()), ""))); err == nil {
		t.Fatal("an hour-long token passed a ten-minute limit")
	}
	raw, err := MintWithin(k, baseClaims(5*time.Minute), 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(raw); err != nil {
		t.Fatal(err)
	}
}

func TestMintRefusesLongLifetime(t *testing.T) {
	k := mustKey(t, AlgEdDSA)
	if _, err := Mint(k, baseClaims(DefaultMaxLifetime+time.Hour)); err == nil {
		t.Fatal("minted a token past the default lifetime")
	}
	if _, err := MintWithin(k, baseClaims(2*time.Hour), time.Hour); err == nil {
		t.Fatal("minted a two-hour token under a one-hour limit")
	}
	if _, err := Mint(k, baseClaims(DefaultMaxLifetime)); err != nil {
		t.Fatal(err)
	}
}

func TestRevokeUntil(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	leeway := 30 * time.Second
	c := &Claims{RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour))}}
	if got := RevokeUntil(c, now, 0, leeway); !got.Equal(now.Add(time.Hour + leeway)) {
		t.Fatalf("token with exp: %s", got)
	}
	far := &Claims{RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(now.Add(400 * 24 * time.Hour))}}
	if got := RevokeUntil(far, now, 2*time.Hour, leeway); !got.Equal(now.Add(2*time.Hour + leeway)) {
		t.Fatalf("token past the limit: %s", got)
	}
	if got := RevokeUntil(nil, now, 0, leeway); !got.Equal(now.Add(DefaultMaxLifetime + leeway)) {
		t.Fatalf("jti only: %s", got)
	}
}

// TestTreeBudget: every token of a tree knows the root's budget and the
// root's id, however deep it was derived.
func TestTreeBudget(t *testing.T) {
	root := baseClaims(time.Hour)
	root.ID = "root"
	root.Budget = &Budget{MaxCalls: 10}
	child, err := Attenuate(&root, Claims{Budget: &Budget{MaxCalls: 3}})
	if err != nil {
		t.Fatal(err)
	}
	child.ID = "child"
	grandchild, err := Attenuate(&child, Claims{Budget: &Budget{MaxCalls: 1}})
	if err != nil {
		t.Fatal(err)
	}
	grandchild.ID = "grandchild"
	for _, c := range []*Claims{&root, &child, &grandchild} {
		if c.Root() != "root" || c.TreeBudget().MaxCalls != 10 {
			t.Fatalf("%s: root %s, tree budget %+v", c.ID, c.Root(), c.TreeBudget())
		}
	}
	if grandchild.Budget.MaxCalls != 1 {
		t.Fatalf("grandchild's own budget %+v", grandchild.Budget)
	}
	free := baseClaims(time.Hour)
	free.ID = "free"
	fc, err := Attenuate(&free, Claims{Budget: &Budget{MaxCalls: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if fc.TreeBudget() == nil || fc.TreeBudget().MaxCalls != 0 {
		t.Fatalf("a child of an unlimited root: tree budget %+v", fc.TreeBudget())
	}
}

// TestTenantNames: a token names a tenant by the rule ingest applies to the
// subject's tenant; minting and verifying refuse the rest.
func TestTenantNames(t *testing.T) {
	k := mustKey(t, AlgEdDSA)
	v := verifier(k)
	now := time.Now().Unix()
	for _, tc := range []struct {
		tenant string
		ok     bool
	}{
		{"acme", true}, {"Acme_01-x", true}, {strings.Repeat("a", 64), true},
		{"*", false}, {">", false}, {"acme.other", false}, {"_system", false}, {"_x", false},
		{"a b", false}, {"ac/me", false}, {strings.Repeat("a", 65), false}, {"é", false},
	} {
		t.Run(tc.tenant, func(t *testing.T) {
			c := baseClaims(time.Minute)
			c.TenantID = tc.tenant
			_, err := Mint(k, c)
			if (err == nil) != tc.ok {
				t.Fatalf("mint: %v", err)
			}
			tj, _ := json.Marshal(tc.tenant)
			raw := craft(t, k, nil, strings.Replace(payload(fmt.Sprint(now+60), fmt.Sprint(now), ""), `"acme"`, string(tj), 1))
			_, err = v.Verify(raw)
			if tc.ok {
				if err != nil {
					t.Fatalf("verify: %v", err)
				}
				return
			}
			wantCode(t, err, api.ETokenInvalid)
		})
	}
}
