package signedstate

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// TestRevocation: a revocation counts only as the operator's signed
// revoke request for exactly its token and until.
func TestRevocation(t *testing.T) {
	until := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	body, _ := json.Marshal(api.RevokeRequest{JTI: "tok-1", Until: until, Reason: "leaked"})
	signed := &api.DecisionProof{Subject: subjects.SvcTokensRevoke, Body: body}
	alice := func(*api.DecisionProof) (string, error) { return "operator:alice", nil }
	forged := func(*api.DecisionProof) (string, error) { return "", errors.New("bad signature") }
	rec := kvstore.Revocation{Until: until, RevokedBy: "operator:alice", Proof: signed}
	cases := []struct {
		name   string
		rec    kvstore.Revocation
		jti    string
		verify Verify
		ok     bool
	}{
		{"signed by the operator it names", rec, "tok-1", alice, true},
		{"until in another zone", kvstore.Revocation{Until: until.In(time.FixedZone("x", 3600)), RevokedBy: "operator:alice", Proof: signed}, "tok-1", alice, true},
		{"unsigned", kvstore.Revocation{Until: until, RevokedBy: "operator:alice"}, "tok-1", alice, false},
		{"a signature that does not verify", rec, "tok-1", forged, false},
		{"another token's revocation put under this key", rec, "tok-2", alice, false},
		{"a later until", kvstore.Revocation{Until: until.Add(time.Hour), RevokedBy: "operator:alice", Proof: signed}, "tok-1", alice, false},
		{"another operator named", kvstore.Revocation{Until: until, RevokedBy: "operator:bob", Proof: signed}, "tok-1", alice, false},
		{"a signed request to another endpoint", kvstore.Revocation{Until: until, RevokedBy: "operator:alice",
			Proof: &api.DecisionProof{Subject: subjects.SvcPolicyPush, Body: body}}, "tok-1", alice, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := Revocation(c.rec, c.jti, c.verify); (err == nil) != c.ok {
				t.Fatalf("Revocation: %v, want ok=%v", err, c.ok)
			}
		})
	}
}
