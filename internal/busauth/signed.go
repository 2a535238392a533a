package busauth

import (
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Signed requests prove who sent a request inside account TOOLGATE, where
// the server stamps no identity (Nats-Request-Info is added only to requests
// that cross accounts, and within an account a client may write that header
// itself). The sender attaches its toolgate credentials' user JWT and signs
// subject, time and body with the credentials' nkey; the service checks the
// JWT was issued by the deployment's credential signer and the signature by
// the JWT's subject key. Approvals use it to record who decided.
const (
	HeaderCredsJWT  = "Toolgate-Creds-Jwt"
	HeaderSignature = "Toolgate-Signature"
	HeaderSignedAt  = "Toolgate-Signed-At"
)

// ErrUnsigned is returned by RequestVerifier.Verify for a request that is
// not signed, or not signed by credentials of this deployment.
var ErrUnsigned = errors.New("request not signed by toolgate credentials")

// Signer signs requests with one set of credentials.
type Signer struct {
	JWT string
	Key nkeys.KeyPair
}

// SignerFromCreds reads a .creds file written by IssueCredentials.
func SignerFromCreds(path string) (*Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading credentials: %w", err)
	}
	tok, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return nil, fmt.Errorf("credentials %s: %w", path, err)
	}
	kp, err := jwt.ParseDecoratedNKey(b)
	if err != nil {
		return nil, fmt.Errorf("credentials %s: %w", path, err)
	}
	return &Signer{JWT: tok, Key: kp}, nil
}

// SignerFromParts makes a Signer from an nkey seed file and the user JWT
// (the nats CLI's --nkey and --token, as serve prints them).
func SignerFromParts(seedFile, userJWT string) (*Signer, error) {
	b, err := os.ReadFile(seedFile)
	if err != nil {
		return nil, fmt.Errorf("reading nkey: %w", err)
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
	if err != nil {
		return nil, fmt.Errorf("nkey %s: %w", seedFile, err)
	}
	return &Signer{JWT: strings.TrimSpace(userJWT), Key: kp}, nil
}

// Sign adds the signature headers for a request of body on subject to h
// (a new header when nil) and returns it.
func (s *Signer) Sign(h nats.Header, subject string, body []byte, now time.Time) (nats.Header, error) {
	if h == nil {
		h = nats.Header{}
	}
	at := strconv.FormatInt(now.UnixMilli(), 10)
	sig, err := s.Key.Sign(signedPayload(subject, at, body))
	if err != nil {
		return nil, err
	}
	h.Set(HeaderCredsJWT, s.JWT)
	h.Set(HeaderSignedAt, at)
	h.Set(HeaderSignature, base64.RawURLEncoding.EncodeToString(sig))
	return h, nil
}

func signedPayload(subject, at string, body []byte) []byte {
	return append([]byte(subject+"\n"+at+"\n"), body...)
}

// RequestVerifier checks signed requests.
type RequestVerifier struct {
	// CredSigner is the public key of the deployment's credential signer
	// (the issuer of every worker's and operator's user JWT).
	CredSigner string
	// MaxAge bounds how old a signature may be (replays); default 2 minutes.
	MaxAge time.Duration
	Now    func() time.Time
}

// CredSignerOf returns the issuer of the user JWT in a .creds file: a
// worker learns the deployment's credential signer from its own credentials.
func CredSignerOf(credsPath string) (string, error) {
	s, err := SignerFromCreds(credsPath)
	if err != nil {
		return "", err
	}
	uc, err := jwt.DecodeUserClaims(s.JWT)
	if err != nil {
		return "", err
	}
	return uc.Issuer, nil
}

// Verify returns the identity that signed the request, or an error
// wrapping ErrUnsigned.
func (v RequestVerifier) Verify(subject string, h nats.Header, body []byte) (Identity, error) {
	tok, at, sig := h.Get(HeaderCredsJWT), h.Get(HeaderSignedAt), h.Get(HeaderSignature)
	if tok == "" || at == "" || sig == "" {
		return Identity{}, fmt.Errorf("%w: no %s, %s and %s headers", ErrUnsigned, HeaderCredsJWT, HeaderSignedAt, HeaderSignature)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return Identity{}, fmt.Errorf("%w: %v", ErrUnsigned, err)
	}
	if uc.Issuer != v.CredSigner || uc.IssuerAccount != "" {
		return Identity{}, fmt.Errorf("%w: credentials issued by %s", ErrUnsigned, uc.Issuer)
	}
	id := Identity{Name: uc.Name}
	for _, t := range uc.Tags {
		if r, ok := strings.CutPrefix(t, roleTagPrefix); ok {
			id.Role = Role(r)
		}
	}
	if !id.Role.Issued() {
		return Identity{}, fmt.Errorf("%w: credentials name no toolgate role", ErrUnsigned)
	}
	now := time.Now()
	if v.Now != nil {
		now = v.Now()
	}
	if uc.Expires > 0 && !time.Unix(uc.Expires, 0).After(now) {
		return id, fmt.Errorf("%w: credentials expired", ErrUnsigned)
	}
	ms, err := strconv.ParseInt(at, 10, 64)
	if err != nil {
		return id, fmt.Errorf("%w: bad %s", ErrUnsigned, HeaderSignedAt)
	}
	maxAge := v.MaxAge
	if maxAge == 0 {
		maxAge = 2 * time.Minute
	}
	if d := now.Sub(time.UnixMilli(ms)); d > maxAge || d < -maxAge {
		return id, fmt.Errorf("%w: signed %s from now", ErrUnsigned, d.Round(time.Second))
	}
	raw, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		return id, fmt.Errorf("%w: signature is not base64", ErrUnsigned)
	}
	kp, err := nkeys.FromPublicKey(uc.Subject)
	if err != nil {
		return id, fmt.Errorf("%w: %v", ErrUnsigned, err)
	}
	if err := kp.Verify(signedPayload(subject, at, body), raw); err != nil {
		return id, fmt.Errorf("%w: bad signature", ErrUnsigned)
	}
	return id, nil
}
