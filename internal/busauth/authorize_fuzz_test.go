package busauth

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
)

// oneToken admits exactly one capability token.
type oneToken struct{ raw string }

func (v oneToken) VerifyConnectToken(_ context.Context, raw string) (AgentToken, error) {
	if raw != v.raw {
		return AgentToken{}, ErrBadToken
	}
	return AgentToken{Tenant: "demo", Subject: "did:a", ID: "tok-1", Expires: time.Now().Add(time.Hour)}, nil
}

// FuzzAuthorize feeds CONNECT options, which come from whoever opens a
// socket, to the decision both the callout and the in-process
// authenticator make. Whatever the input, it must not panic, and it may
// admit a connection only with the one valid token or with the issued
// credentials' user JWT and a valid signature of the nonce; an admitted
// identity always has a grant.
func FuzzAuthorize(f *testing.F) {
	dir := f.TempDir()
	k, err := WriteCredentials(dir)
	if err != nil {
		f.Fatal(err)
	}
	c, err := NewCallout(CalloutConfig{Keys: k, Verifier: oneToken{"the-token"}, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	var o nats.Options
	if err := CredentialsOption(filepath.Join(dir, DirName, CredsFile(RoleExecute)))(&o); err != nil {
		f.Fatal(err)
	}
	sig, _ := o.SignatureCB([]byte("nonce-1"))
	f.Add("", o.Nkey, encodeSig(sig), o.Token, "", "", "nonce-1")
	f.Add(o.Token, "", encodeSig(sig), "", "", "", "nonce-1")
	f.Add("", "", "", "the-token", "", "", "n")
	f.Add("", "", "", "", "admin", "admin", "n")
	f.Add("", o.Nkey, "!!", o.Token+"x", "", "", "nonce-1")
	f.Fuzz(func(t *testing.T, ujwt, nkey, sig, tok, user, pass, nonce string) {
		req := &jwt.AuthorizationRequestClaims{}
		req.ClientInformation = jwt.ClientInformation{ID: 1, Nonce: nonce}
		req.ConnectOptions = jwt.ConnectOptions{JWT: ujwt, Nkey: nkey, SignedNonce: sig, Token: tok, Username: user, Password: pass}
		id, err := c.Authorize(context.Background(), req)
		if err != nil {
			return
		}
		if _, gerr := GrantFor(id); gerr != nil {
			t.Fatalf("admitted %+v without a grant: %v", id, gerr)
		}
		switch id.Role {
		case RoleAgent:
			if tok != "the-token" || ujwt != "" || nkey != "" {
				t.Fatalf("admitted an agent with token %q", tok)
			}
		default:
			if (ujwt != o.Token && tok != o.Token) || verifyNonce(o.Nkey, []byte(nonce), sig) != nil {
				t.Fatalf("admitted %s without the credentials and the nonce's signature", id.Role)
			}
		}
	})
}

// TestCredsJWTDroppedExplained: a CONNECT whose JWT the server dropped
// (nats --creds against accounts) is refused with what to give instead.
func TestCredsJWTDroppedExplained(t *testing.T) {
	k, err := WriteCredentials(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCallout(CalloutConfig{Keys: k, Verifier: oneToken{"the-token"}, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	req := &jwt.AuthorizationRequestClaims{}
	req.ClientInformation = jwt.ClientInformation{ID: 1, Nonce: "n"}
	req.ConnectOptions = jwt.ConnectOptions{SignedNonce: "c2lnbmVk"}
	_, err = c.Authorize(context.Background(), req)
	if !errors.Is(err, ErrNoCredentials) || !strings.Contains(err.Error(), "creds context") || !strings.Contains(err.Error(), "--nkey") {
		t.Fatalf("refusal %v: want ErrNoCredentials saying how to connect instead", err)
	}
}
