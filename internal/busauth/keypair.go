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

// keyPair is an Ed25519 key kept in a data directory's DirName folder as
// two files: the private half (an nkeys seed of prefix N) for the one role
// that signs, the public half (N…) for those that verify. The hop-sealing
// key and the audit chain key are kept so.
type keyPair struct {
	priv, pub string // file names
	what      string // "hop-sealing key", for errors
	none      error  // wrapped when a file holds no such key
}

var (
	sealKey       = keyPair{SealKeyFile, SealPublicFile, "hop-sealing key", ErrNoSealKey}
	auditChainKey = keyPair{AuditChainKeyFile, AuditChainPublicFile, "audit chain key", ErrNoAuditChainKey}
)

// loadOrCreate returns the private key, generating both files (0600, in a
// 0700 folder) when neither is there. A public half without its private
// one is never replaced: others trust it.
func (k keyPair) loadOrCreate(dataDir string) (ed25519.PrivateKey, error) {
	key, err := k.load(dataDir)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	if _, perr := os.Stat(filepath.Join(dataDir, DirName, k.pub)); perr == nil {
		return nil, fmt.Errorf("%w: %s is there but %s is not", k.none, k.pub, k.priv)
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
	if err := writeSecret(filepath.Join(dir, k.priv), append(seed, '\n')); err != nil {
		return nil, err
	}
	if err := writeSecret(filepath.Join(dir, k.pub), []byte(mustPublic(kp)+"\n")); err != nil {
		return nil, err
	}
	return k.load(dataDir)
}

// load reads the private key.
func (k keyPair) load(dataDir string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, DirName, k.priv))
	if err != nil {
		return nil, fmt.Errorf("reading the %s: %w", k.what, err)
	}
	pfx, raw, err := nkeys.DecodeSeed([]byte(strings.TrimSpace(string(b))))
	if err != nil || pfx != nkeys.PrefixByteServer {
		return nil, fmt.Errorf("%w: %s is not an nkeys seed of prefix N", k.none, k.priv)
	}
	return ed25519.NewKeyFromSeed(raw), nil
}

// parsePublic reads a public key as the public file holds it.
func (k keyPair) parsePublic(b []byte) (ed25519.PublicKey, error) {
	raw, err := nkeys.Decode(nkeys.PrefixByteServer, []byte(strings.TrimSpace(string(b))))
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w: %s is not a public nkey of prefix N", k.none, k.pub)
	}
	return ed25519.PublicKey(raw), nil
}

// loadPublic reads the public key: the public file, or the public half of
// the private one when only that is there.
func (k keyPair) loadPublic(dataDir string) (ed25519.PublicKey, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, DirName, k.pub))
	if errors.Is(err, fs.ErrNotExist) {
		key, kerr := k.load(dataDir)
		if kerr != nil {
			return nil, fmt.Errorf("reading the %s's public half: %w", k.what, err)
		}
		return key.Public().(ed25519.PublicKey), nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the %s's public half: %w", k.what, err)
	}
	return k.parsePublic(b)
}
