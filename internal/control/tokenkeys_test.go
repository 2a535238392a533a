package control

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/token"
)

// TestTokenKeys: tokens.keys answers the verifier's key set as a JWKS
// holding public keys only (ParseKeySet refuses private members), the
// set in force at each request; without a key set, E3226.
func TestTokenKeys(t *testing.T) {
	k, err := token.GenerateSigningKey(token.AlgEdDSA)
	if err != nil {
		t.Fatal(err)
	}
	keys := &swapKeys{set: k.KeySet()}
	h := &handlers{disc: Discovery{Tokens: &token.Verifier{Keys: keys}}}
	fetch := func() *token.KeySet {
		t.Helper()
		r := &fakeRequest{data: []byte(`{}`)}
		h.tokenKeys(r)
		if r.code != "" {
			t.Fatalf("tokens.keys: %s %s", r.code, r.body)
		}
		b, ok := r.answer.(json.RawMessage)
		if !ok {
			t.Fatalf("answer %T", r.answer)
		}
		if bytes.Contains(b, []byte(`"d"`)) {
			t.Fatalf("the published set holds a private member: %s", b)
		}
		ks, err := token.ParseKeySet(b)
		if err != nil {
			t.Fatalf("published set: %v\n%s", err, b)
		}
		return ks
	}
	if got := fetch().Kids(); len(got) != 1 || got[0] != k.KID {
		t.Fatalf("kids %v, want [%s]", got, k.KID)
	}
	// Rotated: the next request gets the new set.
	k2, err := token.GenerateSigningKey(token.AlgRS256)
	if err != nil {
		t.Fatal(err)
	}
	keys.set = k2.KeySet()
	if got := fetch(); got.Fingerprint() != k2.KeySet().Fingerprint() {
		t.Fatalf("after rotation kids %v, want [%s]", got.Kids(), k2.KID)
	}
	for _, h := range []*handlers{{}, {disc: Discovery{Tokens: &token.Verifier{Keys: token.StaticKeys{}}}}} {
		r := &fakeRequest{}
		h.tokenKeys(r)
		if got := r.ecode(t); got != api.ENoKeySet {
			t.Fatalf("without a key set: %q, want %s", got, api.ENoKeySet)
		}
	}
}

// swapKeys is a key source whose set the test replaces.
type swapKeys struct{ set *token.KeySet }

func (s *swapKeys) KeySet() *token.KeySet { return s.set }
