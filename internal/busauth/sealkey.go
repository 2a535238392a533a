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

// Files of the hop-sealing key in a data directory's DirName folder. The
// authorize stage signs each decision with the private key (seal.nk, an
// nkeys seed of prefix N); the execute stage verifies with the public key
// (seal.pub) alone. Neither is part of any credentials file: a leaked
// worker credential cannot seal a hop.
const (
	SealKeyFile    = "seal.nk"
	SealPublicFile = "seal.pub"
)

// ErrNoSealKey is returned when a data directory holds no sealing key.
var ErrNoSealKey = errors.New("no hop-sealing key")

// LoadOrCreateSealKey returns the deployment's hop-sealing key from
// dataDir/busauth, generating seal.nk and seal.pub (0600, in a 0700
// folder) when neither is there. Like the other keys, copy the folder to
// every host that runs authorize (seal.nk) or execute (seal.pub).
func LoadOrCreateSealKey(dataDir string) (ed25519.PrivateKey, error) {
	k, err := LoadSealKey(dataDir)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	if _, perr := os.Stat(filepath.Join(dataDir, DirName, SealPublicFile)); perr == nil {
		// A public key without its private half: never replace the key
		// the execute workers trust.
		return nil, fmt.Errorf("%w: %s is there but %s is not", ErrNoSealKey, SealPublicFile, SealKeyFile)
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
	if err := writeSecret(filepath.Join(dir, SealKeyFile), append(seed, '\n')); err != nil {
		return nil, err
	}
	if err := writeSecret(filepath.Join(dir, SealPublicFile), []byte(mustPublic(kp)+"\n")); err != nil {
		return nil, err
	}
	return LoadSealKey(dataDir)
}

// LoadSealKey reads the private hop-sealing key from dataDir/busauth.
func LoadSealKey(dataDir string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, DirName, SealKeyFile))
	if err != nil {
		return nil, fmt.Errorf("reading the hop-sealing key: %w", err)
	}
	pfx, raw, err := nkeys.DecodeSeed([]byte(strings.TrimSpace(string(b))))
	if err != nil || pfx != nkeys.PrefixByteServer {
		return nil, fmt.Errorf("%w: %s is not an nkeys seed of prefix N", ErrNoSealKey, SealKeyFile)
	}
	return ed25519.NewKeyFromSeed(raw), nil
}

// LoadSealPublicKey reads the public hop-sealing key from dataDir/busauth:
// seal.pub, or the public half of seal.nk when only that is there.
func LoadSealPublicKey(dataDir string) (ed25519.PublicKey, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, DirName, SealPublicFile))
	if errors.Is(err, fs.ErrNotExist) {
		k, kerr := LoadSealKey(dataDir)
		if kerr != nil {
			return nil, fmt.Errorf("reading the hop-sealing public key: %w", err)
		}
		return k.Public().(ed25519.PublicKey), nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the hop-sealing public key: %w", err)
	}
	raw, err := nkeys.Decode(nkeys.PrefixByteServer, []byte(strings.TrimSpace(string(b))))
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w: %s is not a public nkey of prefix N", ErrNoSealKey, SealPublicFile)
	}
	return ed25519.PublicKey(raw), nil
}

// SealKeyID names a public sealing key as seal.pub writes it (N…).
func SealKeyID(pub ed25519.PublicKey) string {
	b, err := nkeys.Encode(nkeys.PrefixByteServer, pub)
	if err != nil {
		return ""
	}
	return string(b)
}

// HasKeys reports whether dataDir/busauth holds a deployment's bus keys
// (written by WriteCredentials).
func HasKeys(dataDir string) bool {
	_, err := os.Stat(filepath.Join(dataDir, DirName, issuerFile))
	return err == nil
}
