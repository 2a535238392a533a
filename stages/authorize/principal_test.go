package authorize

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages/execute/kinds"
	"github.com/toolgate/toolgate/subjects"
)

// TestPrincipalSignedOrSealed: an admitted call's principal is covered by
// its seal and signed no more; a refused one is signed, for audit's hooks.
// A re-drive on an operator's decision runs as a principal the original's
// seal covers, or one signed the older way, and is refused (E3225) as one
// changed after authorize.
func TestPrincipalSignedOrSealed(t *testing.T) {
	ctx := context.Background()
	key, engine, reg := echoSetup(t)
	raw, err := token.Mint(key, token.Claims{ToolID: token.Patterns{"echo"}, TenantID: "acme", AgentDID: "did:agent:a",
		RegisteredClaims: jwt.RegisteredClaims{ID: "tok-1", Issuer: issuer, Audience: jwt.ClaimStrings{audience},
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}})
	if err != nil {
		t.Fatal(err)
	}
	_, sealKey, _ := ed25519.GenerateKey(nil)
	hopPub, hopKey, _ := ed25519.GenerateKey(nil)
	sealer := seal.NewSealer(sealKey)
	signer := seal.NewSigner(busauth.RoleAuthorize, hopKey)
	msgs := seal.NewMessages(map[busauth.Role]ed25519.PublicKey{busauth.RoleAuthorize: hopPub})
	var signed int
	a := New(Config{Registry: reg, Kinds: kinds.Compiled(), Policy: engine, Store: newFakeStore(),
		Verifier: &token.Verifier{Keys: token.StaticKeys{Set: key.KeySet()}, Issuer: issuer, Audience: audience},
		Sealer:   sealer,
		SignPrincipal: func(text []byte) string {
			signed++
			return signer.SignRecord("principal", text)
		},
		PrincipalSigned: func(text []byte, sig string) bool { return msgs.Record(busauth.RoleAuthorize, "principal", text, sig) },
		PrincipalSealed: seal.NewVerifier(sealer.Public()).Principal,
		RedriveProof:    func(*api.DecisionProof) (string, error) { return "operator:local", nil },
	})
	call := func(id, tool string) (*envelope.Invocation, error) {
		inv := &envelope.Invocation{ID: id, Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: 3},
			Request: &api.Request{ToolID: tool, CapabilityToken: raw, Parameters: []byte(`{}`),
				AgentContext: api.AgentContext{AgentDID: "did:agent:a", TenantID: "acme"}}}
		_, err := a.Process(ctx, inv)
		return inv, err
	}
	admitted, err := call("i-1", "echo")
	if err != nil || admitted.Authz == nil || admitted.Authz.Seal == nil {
		t.Fatalf("admitted: %v", err)
	}
	if admitted.Principal.Sig != "" || signed != 0 {
		t.Fatalf("a sealed call's principal was signed apart (%d signatures)", signed)
	}
	reg.Put(&tools.Manifest{ID: "other", Version: "1.0.0", Kind: "builtin"})
	refused, err := call("i-2", "other")
	if !errors.Is(err, &api.Error{Code: api.PermissionDenied}) || refused.Principal == nil {
		t.Fatalf("a call of a tool the token does not grant: %v", err)
	}
	if !msgs.Record(busauth.RoleAuthorize, "principal", envelope.PrincipalText(refused), refused.Principal.Sig) {
		t.Fatal("a refused call's principal is not signed")
	}

	// A principal the hop arrived with is never signed: authorize signs
	// only the one it set from claims it verified.
	forged := &envelope.Invocation{ID: "i-4", Tenant: "acme", Status: api.StatusPending,
		Principal: &envelope.Principal{Session: "victim", Claims: json.RawMessage(`{"tenant_id":"acme","sub":"did:agent:root"}`)},
		Request: &api.Request{ToolID: "echo", CapabilityToken: "not-a-token", Parameters: []byte(`{}`),
			AgentContext: api.AgentContext{AgentDID: "did:agent:a", TenantID: "acme"}}}
	for _, tool := range []string{"echo", "unknown"} { // the token refused; the tool unknown
		forged.Request.ToolID = tool
		if _, err := a.Process(ctx, forged); err == nil || forged.Principal.Sig != "" {
			t.Fatalf("%s: a principal authorize did not set was signed (%v)", tool, err)
		}
	}

	// A re-drive on the operator's decision of each, as audit keeps them.
	redrive := func(orig *envelope.Invocation, change func(p *api.DeadLetterPrincipal)) error {
		p := &api.DeadLetterPrincipal{Session: orig.Principal.Session, Claims: orig.Principal.Claims, Sig: orig.Principal.Sig}
		if orig.Authz != nil && orig.Authz.Seal != nil {
			p.Seal, _ = json.Marshal(orig.Authz.Seal)
		}
		if change != nil {
			change(p)
		}
		body, _ := json.Marshal(api.RedriveRunRequest{Tenant: "acme", IDs: []string{orig.ID}, Decision: true})
		inv := &envelope.Invocation{ID: subjects.RedriveID(orig.ID, 1), Tenant: "acme", Status: api.StatusPending,
			Request: &api.Request{ToolID: "echo", Parameters: []byte(`{}`), AgentContext: api.AgentContext{AgentDID: "did:agent:a", TenantID: "acme"},
				Redrive: &api.Redrive{Original: orig.ID, Root: orig.ID, Depth: 1, By: "operator:local", Decision: true, Principal: p,
					Proof: &api.DecisionProof{Subject: subjects.SvcRedriveRun, Body: body}}}}
		_, err := a.Process(ctx, inv)
		return err
	}
	unsigned := &api.Error{Code: api.PermissionDenied, ECode: api.ERecordUnsigned}
	if err := redrive(admitted, nil); err != nil {
		t.Fatalf("a re-drive as the sealed principal: %v", err)
	}
	if err := redrive(refused, func(p *api.DeadLetterPrincipal) { p.Seal = nil }); err != nil {
		t.Fatalf("a re-drive as a principal signed apart: %v", err)
	}
	for name, change := range map[string]func(p *api.DeadLetterPrincipal){
		"another token id": func(p *api.DeadLetterPrincipal) {
			p.Claims = json.RawMessage(strings.Replace(string(p.Claims), `"tok-1"`, `"tok-9"`, 1))
		},
		"another session": func(p *api.DeadLetterPrincipal) { p.Session = "victim" },
		"no seal":         func(p *api.DeadLetterPrincipal) { p.Seal = nil },
		"another call's seal": func(p *api.DeadLetterPrincipal) {
			other, _ := call("i-3", "echo")
			p.Seal, _ = json.Marshal(other.Authz.Seal)
		},
	} {
		if err := redrive(admitted, change); !errors.Is(err, unsigned) {
			t.Errorf("%s: %v, want %s", name, err, api.ERecordUnsigned)
		}
	}
}

// TestTokenFormsBounded: the forms kept by raw token stay within their
// count and their tokens' bytes, and a token kept is read back, not made.
func TestTokenFormsBounded(t *testing.T) {
	var f forms[int]
	made := 0
	make := func() (int, error) { made++; return made, nil }
	big := strings.Repeat("x", 1<<20)
	for i := range 20 {
		if _, err := f.value(fmt.Sprint(i, big), make); err != nil {
			t.Fatal(err)
		}
		if f.bytes > maxCachedTokenBytes || len(f.m) > maxCachedTokens {
			t.Fatalf("after %d tokens: %d kept, %d bytes", i+1, len(f.m), f.bytes)
		}
	}
	v, _ := f.value(fmt.Sprint(19, big), make)
	if v != 20 || made != 20 {
		t.Fatalf("the last token's form was made again: %d, %d made", v, made)
	}
	for i := range maxCachedTokens + 1 {
		_, _ = f.value(fmt.Sprint(i), make)
	}
	if len(f.m) > maxCachedTokens {
		t.Fatalf("%d forms kept", len(f.m))
	}
}
