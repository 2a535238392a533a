package busauth

import (
	"context"
	"encoding/base64"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

type staticVerifier struct{ tok AgentToken }

func (v staticVerifier) VerifyConnectToken(context.Context, string) (AgentToken, error) {
	return v.tok, nil
}

// calloutRequest is an authorization request as nats-server sends it:
// signed by the server's key, encrypted to the callout's xkey.
func calloutRequest(b *testing.B, k *Keys, o jwt.ConnectOptions, nonce string) ([]byte, string) {
	srv, _ := nkeys.CreateServer()
	srvX, _ := nkeys.CreateCurveKeys()
	ukp, _ := nkeys.CreateUser()
	req := jwt.NewAuthorizationRequestClaims(mustPublic(srv))
	req.UserNkey = mustPublic(ukp)
	req.Server = jwt.ServerID{Name: "bench", ID: mustPublic(srv), XKey: mustPublic(srvX)}
	req.ClientInformation = jwt.ClientInformation{Host: "127.0.0.1", ID: 7, Nonce: nonce}
	req.ConnectOptions = o
	tok, err := req.Encode(srv)
	if err != nil {
		b.Fatal(err)
	}
	sealed, err := srvX.Seal([]byte(tok), mustPublic(k.XKey))
	if err != nil {
		b.Fatal(err)
	}
	return sealed, mustPublic(srvX)
}

// BenchmarkHandle is the callout's own work for one CONNECT (decrypt,
// verify the request, check the credentials, sign the user and the answer,
// encrypt), without the network.
func BenchmarkHandle(b *testing.B) {
	dir := b.TempDir()
	k, err := WriteCredentials(dir)
	if err != nil {
		b.Fatal(err)
	}
	c, err := NewCallout(CalloutConfig{Keys: k, Verifier: staticVerifier{AgentToken{Tenant: "demo", Subject: "did:a", ID: "tok-1",
		Expires: time.Now().Add(time.Hour)}}})
	if err != nil {
		b.Fatal(err)
	}
	creds := filepath.Join(dir, DirName, CredsFile(RoleExecute))
	var o nats.Options
	if err := CredentialsOption(creds)(&o); err != nil {
		b.Fatal(err)
	}
	sig, _ := o.SignatureCB([]byte("nonce-1"))
	for _, tc := range []struct {
		name string
		o    jwt.ConnectOptions
	}{
		{"stage", jwt.ConnectOptions{Nkey: o.Nkey, Token: o.Token, SignedNonce: encodeSig(sig)}},
		{"agent", jwt.ConnectOptions{Token: "opaque-capability-token"}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			data, xk := calloutRequest(b, k, tc.o, "nonce-1")
			cpuPerOp(b, func() {
				if _, err := c.Handle(data, xk); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

func encodeSig(sig []byte) string { return base64.RawURLEncoding.EncodeToString(sig) }
