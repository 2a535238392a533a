package token

import (
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/toolgate/toolgate/api"
)

// MaxTokenBytes bounds a token before any parsing.
const MaxTokenBytes = 16 << 10

// Verifier checks capability tokens.
type Verifier struct {
	Keys KeySource
	// Issuer and Audience are pinned: a token must carry exactly this iss
	// and list this audience.
	Issuer   string
	Audience string
	// Leeway tolerates clock skew on exp, nbf and iat.
	Leeway time.Duration
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Verify parses and checks raw: signature by the key its kid names, with
// that key's one algorithm; issuer, audience, expiry (required), not-before;
// the claims toolgate needs; the form of the grants. Errors are
// *api.Error: E3201 invalid, E3202 expired, E3207 missing claims.
func (v *Verifier) Verify(raw string) (*Claims, error) {
	if raw == "" {
		return nil, invalid("no capability token in the request")
	}
	if len(raw) > MaxTokenBytes {
		return nil, invalid("capability token is longer than %d bytes", MaxTokenBytes)
	}
	ks := v.Keys.KeySet()
	if ks == nil {
		return nil, invalid("no key set is configured")
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(Algorithms),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(v.Leeway),
		jwt.WithIssuer(v.Issuer),
		jwt.WithAudience(v.Audience),
	}
	if v.Now != nil {
		opts = append(opts, jwt.WithTimeFunc(v.Now))
	}
	var c Claims
	_, err := jwt.ParseWithClaims(raw, &c, func(t *jwt.Token) (any, error) {
		kid, _ := t.Header["kid"].(string)
		if kid == "" {
			return nil, errors.New("token has no kid")
		}
		k, ok := ks.keys[kid]
		if !ok {
			return nil, fmt.Errorf("unknown kid %q", kid)
		}
		if t.Method.Alg() != k.alg {
			return nil, fmt.Errorf("kid %q is an %s key, the token says %s", kid, k.alg, t.Method.Alg())
		}
		return k.key, nil
	}, opts...)
	switch {
	case err == nil:
	case errors.Is(err, jwt.ErrTokenExpired):
		return nil, api.WrapError(err, api.PermissionDenied, api.ETokenExpired, "capability token expired")
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return nil, api.WrapError(err, api.PermissionDenied, api.ETokenClaims, "capability token: %v", err)
	default:
		return nil, api.WrapError(err, api.PermissionDenied, api.ETokenInvalid, "invalid capability token: %v", err)
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	return &c, nil
}

// check requires the claims toolgate acts on and refuses malformed grants.
func (c *Claims) check() error {
	var missing []string
	if len(c.ToolID) == 0 {
		missing = append(missing, "tool_id")
	}
	if c.AgentDID == "" {
		missing = append(missing, "agent_did")
	}
	if c.TenantID == "" {
		missing = append(missing, "tenant_id")
	}
	if c.ID == "" {
		missing = append(missing, "jti")
	}
	if len(missing) > 0 {
		return api.NewError(api.PermissionDenied, api.ETokenClaims,
			"capability token lacks required claims: %v", missing).WithDetail("missing", missing)
	}
	if err := c.checkForm(); err != nil {
		return api.WrapError(err, api.PermissionDenied, api.ETokenInvalid, "invalid capability token: %v", err)
	}
	return nil
}

// checkForm refuses grants toolgate could misread.
func (c *Claims) checkForm() error {
	for _, p := range append(append(Patterns{}, c.ToolID...), c.PreApproved...) {
		if err := checkPattern(p); err != nil {
			return err
		}
	}
	if c.ToolVersion != "" {
		if _, err := parseRange(c.ToolVersion); err != nil {
			return err
		}
	}
	if f := c.Filesystem; f != nil {
		if f.Mode != "" && f.Mode != "ro" && f.Mode != "rw" {
			return fmt.Errorf("filesystem mode %q is not ro or rw", f.Mode)
		}
		for _, p := range f.AllowedPaths {
			if _, err := CleanPath(p); err != nil {
				return err
			}
		}
	}
	if n := c.Network; n != nil {
		for _, port := range n.AllowedPorts {
			if port < 1 || port > 65535 {
				return fmt.Errorf("port %d is out of range", port)
			}
		}
	}
	if b := c.Budget; b != nil {
		if b.MaxCalls < 0 || b.MaxRuntimeMS < 0 || b.MaxCost < 0 || b.MaxTokens < 0 || b.ApprovalAfterFailures < 0 {
			return errors.New("budget limits must not be negative")
		}
	}
	return nil
}

func invalid(format string, args ...any) *api.Error {
	return api.NewError(api.PermissionDenied, api.ETokenInvalid, format, args...)
}
