package busauth

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nkeys"
)

// Files of the audit chain's signing key in a data directory's DirName
// folder. The audit stage signs each checkpoint over the AUDIT stream with
// the private key (audit-chain.nk, an nkeys seed of prefix N); verifiers
// need only the public key (audit-chain.pub). No other role holds the
// private half, and no credentials file contains it: an operator who can
// rewrite the stream cannot sign a checkpoint over what it wrote.
const (
	AuditChainKeyFile    = "audit-chain.nk"
	AuditChainPublicFile = "audit-chain.pub"
)

// ErrNoAuditChainKey is returned when a data directory holds no audit chain key.
var ErrNoAuditChainKey = errors.New("no audit chain key")

// LoadOrCreateAuditChainKey returns the deployment's audit chain key from
// dataDir/busauth, generating audit-chain.nk and audit-chain.pub (0600, in
// a 0700 folder) when neither is there. Copy audit-chain.nk to every host
// that runs audit, and audit-chain.pub to whoever verifies the trail.
func LoadOrCreateAuditChainKey(dataDir string) (ed25519.PrivateKey, error) {
	k, err := LoadAuditChainKey(dataDir)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	if _, perr := os.Stat(filepath.Join(dataDir, DirName, AuditChainPublicFile)); perr == nil {
		// Verifiers trust that public key: never replace it.
		return nil, fmt.Errorf("%w: %s is there but %s is not", ErrNoAuditChainKey, AuditChainPublicFile, AuditChainKeyFile)
	}
	kp, err := nkeys.CreatePair(nkeys.PrefixByteServer)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(dataDir, DirName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	if err := writeSecret(filepath.Join(dir, AuditChainKeyFile), append(seed, '\n')); err != nil {
		return nil, err
	}
	if err := writeSecret(filepath.Join(dir, AuditChainPublicFile), []byte(mustPublic(kp)+"\n")); err != nil {
		return nil, err
	}
	return LoadAuditChainKey(dataDir)
}

// LoadAuditChainKey reads the private audit chain key from dataDir/busauth.
func LoadAuditChainKey(dataDir string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, DirName, AuditChainKeyFile))
	if err != nil {
		return nil, fmt.Errorf("reading the audit chain key: %w", err)
	}
	pfx, raw, err := nkeys.DecodeSeed([]byte(strings.TrimSpace(string(b))))
	if err != nil || pfx != nkeys.PrefixByteServer {
		return nil, fmt.Errorf("%w: %s is not an nkeys seed of prefix N", ErrNoAuditChainKey, AuditChainKeyFile)
	}
	return ed25519.NewKeyFromSeed(raw), nil
}

// ParseAuditChainPublicKey reads a public audit chain key as
// audit-chain.pub holds it (N…, surrounding space ignored).
func ParseAuditChainPublicKey(b []byte) (ed25519.PublicKey, error) {
	raw, err := nkeys.Decode(nkeys.PrefixByteServer, []byte(strings.TrimSpace(string(b))))
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w: not a public nkey of prefix N", ErrNoAuditChainKey)
	}
	return ed25519.PublicKey(raw), nil
}

// LoadAuditChainPublicKey reads the public audit chain key from
// dataDir/busauth: audit-chain.pub, or the public half of audit-chain.nk
// when only that is there.
func LoadAuditChainPublicKey(dataDir string) (ed25519.PublicKey, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, DirName, AuditChainPublicFile))
	if errors.Is(err, fs.ErrNotExist) {
		k, kerr := LoadAuditChainKey(dataDir)
		if kerr != nil {
			return nil, fmt.Errorf("reading the audit chain public key: %w", err)
		}
		return k.Public().(ed25519.PublicKey), nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the audit chain public key: %w", err)
	}
	return ParseAuditChainPublicKey(b)
}
