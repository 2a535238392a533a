package busauth

import (
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"

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
	return sealKey.loadOrCreate(dataDir)
}

// LoadSealKey reads the private hop-sealing key from dataDir/busauth.
func LoadSealKey(dataDir string) (ed25519.PrivateKey, error) {
	return sealKey.load(dataDir)
}

// LoadSealPublicKey reads the public hop-sealing key from dataDir/busauth:
// seal.pub, or the public half of seal.nk when only that is there.
func LoadSealPublicKey(dataDir string) (ed25519.PublicKey, error) {
	return sealKey.loadPublic(dataDir)
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
