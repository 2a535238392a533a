package token

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// MaxTokenBytes bounds a token before any parsing.
const MaxTokenBytes = 16 << 10

// DefaultMaxLifetime is the longest a token may live (exp − iat) when the
// verifier names no other limit; Mint refuses longer tokens the same way.
const DefaultMaxLifetime = 24 * time.Hour

// Types are the `typ` header values a token may carry (RFC 8725 §3.11),
// compared without case and with an optional "application/" prefix: what
// toolgate mints (JWT) and the OAuth access-token type (at+jwt). A token
// without `typ` is accepted; any other type is refused.
var Types = []string{"jwt", "at+jwt"}

// Verifier checks capability tokens.
type Verifier struct {
	Keys KeySource
	// Issuer and Audience are pinned: a token must carry exactly this iss
	// and list this audience.
	Issuer   string
	Audience string
	// Leeway tolerates clock skew on exp, nbf and iat.
	Leeway time.Duration
	// MaxLifetime bounds exp − iat (exp − now for a token without iat);
	// zero is DefaultMaxLifetime.
	MaxLifetime time.Duration
	// Now is the clock; nil is time.Now.
	Now func() time.Time

	cache verified
}

// Verify parses and checks raw: signature by the key its kid names, with
// that key's one algorithm; issuer, audience, expiry (required), not-before;
// the claims toolgate needs; the form of the grants. It also refuses a
// `crit` header (toolgate understands no JWS extension, RFC 7515 §4.1.11),
// a `typ` outside Types, exp, nbf or iat that are not JSON numbers, and a
// lifetime over MaxLifetime. Errors are *api.Error: E3201 invalid, E3202
// expired, E3207 missing claims (aud and iss included).
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
	if c := v.cache.get(raw, ks, v.now(), v.Leeway); c != nil {
		return c, nil
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
		if err := checkHeader(t.Header); err != nil {
			return nil, err
		}
		kid, _ := t.Header["kid"].(string)
		if kid == "" {
			return nil, errors.New("token has no kid")
		}
		k, ok := ks.keys[kid]
		if r, refreshes := v.Keys.(Refresher); !ok && refreshes {
			if fresh := r.Refresh(kid); fresh != nil {
				ks = fresh
				k, ok = ks.keys[kid]
			}
		}
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
	if err := checkNumericDates(raw); err != nil {
		return nil, api.WrapError(err, api.PermissionDenied, api.ETokenInvalid, "invalid capability token: %v", err)
	}
	if err := c.checkLifetime(v.maxLifetime(), v.Leeway, v.now()); err != nil {
		return nil, err
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	v.cache.put(raw, ks, &c)
	return &c, nil
}

func (v *Verifier) maxLifetime() time.Duration {
	if v.MaxLifetime > 0 {
		return v.MaxLifetime
	}
	return DefaultMaxLifetime
}

func (v *Verifier) now() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
}

// RevokeUntil is how long a revocation of c must last: until c can no
// longer verify anyway, its expiry plus leeway, and never past the longest
// lifetime a token may have. A nil c (only a jti is known) gets the longest
// lifetime from now.
func RevokeUntil(c *Claims, now time.Time, maxLifetime, leeway time.Duration) time.Time {
	if maxLifetime <= 0 {
		maxLifetime = DefaultMaxLifetime
	}
	limit := now.Add(maxLifetime + leeway)
	if c == nil || c.ExpiresAt == nil {
		return limit
	}
	if exp := c.ExpiresAt.Add(leeway); exp.Before(limit) {
		return exp
	}
	return limit
}

// checkHeader refuses extensions and token types toolgate does not know.
func checkHeader(h map[string]any) error {
	if crit, ok := h["crit"]; ok {
		return fmt.Errorf("header crit %v names extensions toolgate does not understand", crit)
	}
	typ, ok := h["typ"]
	if !ok {
		return nil
	}
	s, _ := typ.(string)
	t := strings.TrimPrefix(strings.ToLower(s), "application/")
	for _, want := range Types {
		if t == want {
			return nil
		}
	}
	return fmt.Errorf("header typ %v is not a capability token type", typ)
}

// checkNumericDates refuses exp, nbf and iat written as anything but a JSON
// number: the JWT library also reads "1795471355" as a date.
func checkNumericDates(raw string) error {
	parts := strings.Split(raw, ".")
	if len(parts) != 3 {
		return errors.New("not three segments")
	}
	payload, err := jwt.NewParser().DecodeSegment(parts[1])
	if err != nil {
		return err
	}
	var claims map[string]json.RawMessage
	if err := json.Unmarshal(payload, &claims); err != nil {
		return err
	}
	for _, name := range []string{"exp", "nbf", "iat"} {
		v, ok := claims[name]
		if !ok {
			continue
		}
		v = bytes.TrimSpace(v)
		if len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
			return fmt.Errorf("%s must be a number of seconds, not %s", name, v)
		}
	}
	return nil
}

// checkLifetime refuses a token that lives longer than max: exp − iat, or
// exp − now when it has no iat.
func (c *Claims) checkLifetime(max, leeway time.Duration, now time.Time) error {
	if c.ExpiresAt == nil {
		return nil // Verify requires exp; Mint checks it first
	}
	start := now
	if c.IssuedAt != nil {
		start = c.IssuedAt.Time
	}
	if life := c.ExpiresAt.Sub(start); life > max+leeway {
		return api.NewError(api.PermissionDenied, api.ETokenInvalid,
			"capability token lives %s, over the %s allowed", life.Round(time.Second), max).
			WithDetail("max_lifetime_s", int64(max/time.Second))
	}
	return nil
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
	// The tenant names subjects and keys: the rule ingest applies to the
	// subject's tenant (so no "*", ">", "." or reserved "_system").
	if err := subjects.CheckTenant(c.TenantID); err != nil {
		return fmt.Errorf("tenant_id: %w", err)
	}
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
