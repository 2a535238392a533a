package api

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// TokenClaims are the routing claims of a capability token, read without
// verifying it: toolgate verifies every token it is handed; a client only
// needs to know where to send and which subjects its token lets it read.
type TokenClaims struct {
	TenantID string `json:"tenant_id"`
	AgentDID string `json:"agent_did"`
	ID       string `json:"jti"`
	Subject  string `json:"sub"`
	// TenantReader tokens may read every call of their tenant.
	TenantReader bool `json:"tenant_reader,omitempty"`
}

// ReadTokenClaims decodes the payload of a JWT without checking its
// signature. (The SDK depends on nats.go alone, so this reads the one
// segment itself rather than through a JWT library.)
func ReadTokenClaims(raw string) (TokenClaims, error) {
	var c TokenClaims
	parts := strings.Split(strings.TrimSpace(raw), ".")
	if len(parts) != 3 {
		return c, errors.New("capability token is not a JWT")
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return c, fmt.Errorf("capability token: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("capability token: %w", err)
	}
	return c, nil
}
