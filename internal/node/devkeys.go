package node

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/toolgate/toolgate/internal/token"
)

// Development identity: the tenant, agent and lifetime of the token that
// `serve --examples` prints.
const (
	DevTenant   = "demo"
	DevAgent    = "did:agent:demo"
	DevTokenTTL = 24 * time.Hour
)

// Files of the development key material, in the data directory.
const (
	devKeyFile   = "dev-signing-key.jwk"
	devJWKSFile  = "dev-jwks.json"
	devTokenFile = "dev-token"
)

// DevTokenPath is where serve --examples writes the development token.
func DevTokenPath(dir string) string { return filepath.Join(dir, devTokenFile) }

// devKeys loads the development signing key from dir, creating it (and its
// public key set) on first use, and mints a development token for the
// example tenant: every tool, read-only access to the whole file root.
func devKeys(dir, issuer, audience string) (*token.SigningKey, string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", err
	}
	keyPath := filepath.Join(dir, devKeyFile)
	k, err := token.LoadSigningKey(keyPath)
	if errors.Is(err, fs.ErrNotExist) {
		if k, err = token.GenerateSigningKey(token.AlgEdDSA); err != nil {
			return nil, "", err
		}
		priv, err := k.MarshalPrivate()
		if err != nil {
			return nil, "", err
		}
		if err := os.WriteFile(keyPath, priv, 0o600); err != nil {
			return nil, "", err
		}
	} else if err != nil {
		return nil, "", fmt.Errorf("development key %s: %w", keyPath, err)
	}
	pub, err := k.PublicJWKS()
	if err != nil {
		return nil, "", err
	}
	if err := os.WriteFile(filepath.Join(dir, devJWKSFile), pub, 0o644); err != nil {
		return nil, "", err
	}
	raw, err := token.Mint(k, token.Claims{
		ToolID: token.Patterns{"*"}, TenantID: DevTenant, AgentDID: DevAgent,
		AllowedOperations: []string{token.OperationExecute},
		Filesystem:        &token.FilesystemGrant{AllowedPaths: []string{"/"}, Mode: "ro"},
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer: issuer, Audience: jwt.ClaimStrings{audience}, Subject: DevAgent,
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(DevTokenTTL)),
		},
	})
	if err != nil {
		return nil, "", err
	}
	if err := os.WriteFile(DevTokenPath(dir), []byte(raw+"\n"), 0o600); err != nil {
		return nil, "", err
	}
	return k, raw, nil
}

// DevJWKSPath is where serve --examples writes the public key set of the
// development key, for components that verify tokens without running a stage.
func DevJWKSPath(dir string) string { return filepath.Join(dir, devJWKSFile) }
