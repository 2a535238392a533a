package busauth

import (
	"crypto/ed25519"
	"errors"
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
	return auditChainKey.loadOrCreate(dataDir)
}

// LoadAuditChainKey reads the private audit chain key from dataDir/busauth.
func LoadAuditChainKey(dataDir string) (ed25519.PrivateKey, error) {
	return auditChainKey.load(dataDir)
}

// ParseAuditChainPublicKey reads a public audit chain key as
// audit-chain.pub holds it (N…, surrounding space ignored).
func ParseAuditChainPublicKey(b []byte) (ed25519.PublicKey, error) {
	return auditChainKey.parsePublic(b)
}

// LoadAuditChainPublicKey reads the public audit chain key from
// dataDir/busauth: audit-chain.pub, or the public half of audit-chain.nk
// when only that is there.
func LoadAuditChainPublicKey(dataDir string) (ed25519.PublicKey, error) {
	return auditChainKey.loadPublic(dataDir)
}
