package token

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"
)

// The signature algorithms toolgate accepts. Each key names exactly one;
// the token never chooses the key type.
const (
	AlgRS256 = "RS256"
	AlgEdDSA = "EdDSA"
)

// Algorithms lists the accepted algorithms.
var Algorithms = []string{AlgRS256, AlgEdDSA}

// minRSABits refuses weak RSA keys.
const minRSABits = 2048

// verificationKey is one public key of a key set.
type verificationKey struct {
	alg string
	key crypto.PublicKey
}

// KeySet holds the public keys tokens are verified with, by key id.
type KeySet struct {
	keys map[string]verificationKey
}

// ParseKeySet reads a JWKS document. Every key needs a kid and an alg of
// RS256 or EdDSA that fits its type; private parts are refused, so a signing
// key pasted by mistake is caught.
func ParseKeySet(b []byte) (*KeySet, error) {
	var raw struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("key set: %w", err)
	}
	ks := &KeySet{keys: map[string]verificationKey{}}
	for i, rk := range raw.Keys {
		var k jose.JSONWebKey
		if err := k.UnmarshalJSON(rk); err != nil {
			return nil, fmt.Errorf("key set: key %d: %w", i, err)
		}
		if !k.IsPublic() {
			return nil, fmt.Errorf("key set: key %q holds private material; publish only the public key", k.KeyID)
		}
		vk, err := checkKey(k)
		if err != nil {
			return nil, fmt.Errorf("key set: %w", err)
		}
		if _, dup := ks.keys[k.KeyID]; dup {
			return nil, fmt.Errorf("key set: kid %q appears twice", k.KeyID)
		}
		ks.keys[k.KeyID] = vk
	}
	if len(ks.keys) == 0 {
		return nil, errors.New("key set: no keys")
	}
	return ks, nil
}

func checkKey(k jose.JSONWebKey) (verificationKey, error) {
	if k.KeyID == "" {
		return verificationKey{}, errors.New("a key has no kid")
	}
	if k.Use != "" && k.Use != "sig" {
		return verificationKey{}, fmt.Errorf("key %q: use %q is not sig", k.KeyID, k.Use)
	}
	pub := k.Key
	if !k.IsPublic() {
		pk := k.Public()
		pub = pk.Key
	}
	switch k.Algorithm {
	case AlgRS256:
		rk, ok := pub.(*rsa.PublicKey)
		if !ok {
			return verificationKey{}, fmt.Errorf("key %q: alg RS256 needs an RSA key", k.KeyID)
		}
		if rk.N.BitLen() < minRSABits {
			return verificationKey{}, fmt.Errorf("key %q: RSA keys need at least %d bits", k.KeyID, minRSABits)
		}
	case AlgEdDSA:
		if _, ok := pub.(ed25519.PublicKey); !ok {
			return verificationKey{}, fmt.Errorf("key %q: alg EdDSA needs an Ed25519 key", k.KeyID)
		}
	default:
		return verificationKey{}, fmt.Errorf("key %q: alg %q is not one of %v", k.KeyID, k.Algorithm, Algorithms)
	}
	return verificationKey{alg: k.Algorithm, key: pub}, nil
}

// LoadKeySet reads a JWKS file.
func LoadKeySet(path string) (*KeySet, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseKeySet(b)
}

// Kids lists the key ids, for logs.
func (ks *KeySet) Kids() []string {
	out := make([]string, 0, len(ks.keys))
	for k := range ks.keys {
		out = append(out, k)
	}
	return out
}

// Fingerprint identifies the key set by its keys, not by how it was
// written: the same keys loaded from a JWKS file or held in memory have
// the same fingerprint. It covers every key's id, algorithm and RFC 7638
// thumbprint.
func (ks *KeySet) Fingerprint() string {
	lines := make([]string, 0, len(ks.keys))
	for kid, vk := range ks.keys {
		tp, err := (&jose.JSONWebKey{Key: vk.key}).Thumbprint(crypto.SHA256)
		if err != nil {
			tp = nil // a key jose cannot thumbprint was refused at parse time
		}
		lines = append(lines, kid+" "+vk.alg+" "+hex.EncodeToString(tp))
	}
	slices.Sort(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// JWKS encodes the set as a JWKS document: public keys only, as the set
// holds nothing else.
func (ks *KeySet) JWKS() ([]byte, error) {
	kids := ks.Kids()
	slices.Sort(kids)
	out := jose.JSONWebKeySet{Keys: make([]jose.JSONWebKey, 0, len(kids))}
	for _, kid := range kids {
		vk := ks.keys[kid]
		out.Keys = append(out.Keys, jose.JSONWebKey{Key: vk.key, KeyID: kid, Algorithm: vk.alg, Use: "sig"})
	}
	return json.Marshal(out)
}

// KeySource gives the current key set; the file behind it may change.
type KeySource interface {
	KeySet() *KeySet
}

// Refresher is a KeySource that can fetch its set again when a token names
// a kid the set lacks (a key rotated in since): Refresh returns the set to
// use now, or nil when there is nothing newer. It decides itself how often
// it really fetches, so forged kids cannot make it fetch on every token.
type Refresher interface {
	KeySource
	Refresh(kid string) *KeySet
}

// StaticKeys is a KeySource that never changes.
type StaticKeys struct{ Set *KeySet }

// KeySet implements KeySource.
func (s StaticKeys) KeySet() *KeySet { return s.Set }

// KeyFile is a KeySource reading a JWKS file and reloading it when it
// changes. A changed file that does not parse is logged and ignored: the
// last good set stays in force.
type KeyFile struct {
	path  string
	cur   atomic.Pointer[KeySet]
	stamp atomic.Value // fileStamp of the loaded version
	log   *slog.Logger
}

type fileStamp struct {
	mod  time.Time
	size int64
}

// OpenKeyFile loads path; it fails if the file does not hold a valid set.
func OpenKeyFile(path string, log *slog.Logger) (*KeyFile, error) {
	if log == nil {
		log = slog.Default()
	}
	f := &KeyFile{path: path, log: log}
	if err := f.Reload(); err != nil {
		return nil, err
	}
	return f, nil
}

// KeySet implements KeySource.
func (f *KeyFile) KeySet() *KeySet { return f.cur.Load() }

// Reload reads the file now.
func (f *KeyFile) Reload() error {
	fi, err := os.Stat(f.path)
	if err != nil {
		return err
	}
	ks, err := LoadKeySet(f.path)
	if err != nil {
		return err
	}
	f.cur.Store(ks)
	f.stamp.Store(fileStamp{fi.ModTime(), fi.Size()})
	return nil
}

// Watch reloads the file when its modification time or size changes,
// checking every interval, until ctx is done.
func (f *KeyFile) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fi, err := os.Stat(f.path)
		if err != nil || f.stamp.Load().(fileStamp) == (fileStamp{fi.ModTime(), fi.Size()}) {
			continue
		}
		if err := f.Reload(); err != nil {
			f.log.Error("key set changed but does not load; keeping the previous one", "path", f.path, "err", err)
			continue
		}
		f.log.Info("key set reloaded", "path", f.path, "kids", f.KeySet().Kids())
	}
}

// SigningKey is a private key with its kid and algorithm.
type SigningKey struct {
	KID string
	Alg string
	Key crypto.Signer
}

// GenerateSigningKey makes a new key for alg (EdDSA or RS256).
func GenerateSigningKey(alg string) (*SigningKey, error) {
	kid := uuid.NewString()
	switch alg {
	case AlgEdDSA:
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		return &SigningKey{KID: kid, Alg: alg, Key: priv}, nil
	case AlgRS256:
		priv, err := rsa.GenerateKey(rand.Reader, minRSABits)
		if err != nil {
			return nil, err
		}
		return &SigningKey{KID: kid, Alg: alg, Key: priv}, nil
	}
	return nil, fmt.Errorf("alg %q is not one of %v", alg, Algorithms)
}

// MarshalPrivate encodes the key as a private JWK.
func (k *SigningKey) MarshalPrivate() ([]byte, error) {
	return json.MarshalIndent(jose.JSONWebKey{Key: k.Key, KeyID: k.KID, Algorithm: k.Alg, Use: "sig"}, "", "  ")
}

// PublicJWKS encodes the public half as a one-key JWKS document.
func (k *SigningKey) PublicJWKS() ([]byte, error) {
	pub := jose.JSONWebKey{Key: k.Key.Public(), KeyID: k.KID, Algorithm: k.Alg, Use: "sig"}
	return json.MarshalIndent(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{pub}}, "", "  ")
}

// ParseSigningKey reads a private JWK.
func ParseSigningKey(b []byte) (*SigningKey, error) {
	var k jose.JSONWebKey
	if err := k.UnmarshalJSON(b); err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	if k.IsPublic() {
		return nil, errors.New("signing key: the JWK holds no private key")
	}
	if _, err := checkKey(k); err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	signer, ok := k.Key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("signing key %q: unsupported key type %T", k.KeyID, k.Key)
	}
	return &SigningKey{KID: k.KeyID, Alg: k.Algorithm, Key: signer}, nil
}

// LoadSigningKey reads a private JWK file.
func LoadSigningKey(path string) (*SigningKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseSigningKey(b)
}

// KeySet returns a key set holding the key's public half.
func (k *SigningKey) KeySet() *KeySet {
	return &KeySet{keys: map[string]verificationKey{k.KID: {alg: k.Alg, key: k.Key.Public()}}}
}

func (k *SigningKey) method() jwt.SigningMethod {
	if k.Alg == AlgEdDSA {
		return jwt.SigningMethodEdDSA
	}
	return jwt.SigningMethodRS256
}
