package token

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"
	"github.com/toolgate/toolgate/api"
)

// Mint signs c with k. It fills in jti and iat when unset, and refuses a
// token without expiry, one living longer than DefaultMaxLifetime, or one
// without the claims Verify requires.
func Mint(k *SigningKey, c Claims) (string, error) {
	return MintWithin(k, c, DefaultMaxLifetime)
}

// MintWithin is Mint with the verifiers' longest lifetime maxLifetime
// (zero: DefaultMaxLifetime).
func MintWithin(k *SigningKey, c Claims, maxLifetime time.Duration) (string, error) {
	if maxLifetime <= 0 {
		maxLifetime = DefaultMaxLifetime
	}
	if c.ID == "" {
		c.ID = uuid.NewString()
	}
	if c.IssuedAt == nil {
		c.IssuedAt = jwt.NewNumericDate(time.Now())
	}
	if c.ExpiresAt == nil {
		return "", fmt.Errorf("mint: a token needs an expiry")
	}
	if err := c.checkLifetime(maxLifetime, 0, time.Now()); err != nil {
		return "", fmt.Errorf("mint: %w", err)
	}
	if err := c.check(); err != nil {
		return "", fmt.Errorf("mint: %w", err)
	}
	t := jwt.NewWithClaims(k.method(), c)
	t.Header["kid"] = k.KID
	raw, err := t.SignedString(k.Key)
	if err != nil {
		return "", err
	}
	if len(raw) > MaxConnectTokenBytes {
		return "", fmt.Errorf("mint: the token is %d bytes, over the %d an agent can connect with (a NATS CONNECT line holds at most 4 KiB): grant fewer tools, paths, hosts or secrets", len(raw), MaxConnectTokenBytes)
	}
	return raw, nil
}

// MaxConnectTokenBytes is the largest token Mint makes: an agent connects with its
// token as the CONNECT's auth_token, and nats-server refuses a control line
// over 4 KiB; the rest of the line (name, version, flags) stays well under
// 512 bytes.
const MaxConnectTokenBytes = 3584

// Attenuate derives a child token's claims from a verified parent and the
// narrowing asked for in want. Fields left empty in want are inherited; a
// field that would grant more than the parent is refused with E3216. The
// child records the parent in its chain, so revoking the parent revokes it.
func Attenuate(parent *Claims, want Claims) (Claims, error) {
	widen := func(format string, args ...any) error {
		return api.NewError(api.PermissionDenied, api.EAttenuationWidens,
			"the child token would widen its parent: "+format, args...)
	}
	c := want
	c.Issuer, c.Audience = parent.Issuer, parent.Audience
	c.ID, c.IssuedAt = "", nil
	c.Chain = append(slices.Clone(parent.Chain), parent.ID)
	if c.RootBudget = parent.TreeBudget(); c.RootBudget == nil {
		c.RootBudget = &Budget{} // the root has no budget: the tree is unlimited
	}

	if c.TenantID == "" {
		c.TenantID = parent.TenantID
	} else if c.TenantID != parent.TenantID {
		return Claims{}, widen("tenant %q differs from %q", c.TenantID, parent.TenantID)
	}
	if c.AgentDID == "" {
		c.AgentDID = parent.AgentDID // may name a sub-agent: delegation narrows nothing away
	}
	if c.Subject == "" {
		c.Subject = parent.Subject
	}
	// Seeing the whole tenant is never inherited by default: a child asks
	// for it, and only a reader's child may have it.
	if c.TenantReader && !parent.TenantReader {
		return Claims{}, widen("tenant_reader where the parent sees only its own agent's calls")
	}
	if c.SessionID == "" {
		c.SessionID = parent.SessionID
	} else if parent.SessionID != "" && c.SessionID != parent.SessionID {
		return Claims{}, widen("session %q differs from %q", c.SessionID, parent.SessionID)
	}

	if len(c.ToolID) == 0 {
		c.ToolID = parent.ToolID
	}
	for _, p := range c.ToolID {
		if err := checkPattern(p); err != nil {
			return Claims{}, err
		}
		if !parent.ToolID.Match(p) {
			return Claims{}, widen("tools %q are not all within %v", p, []string(parent.ToolID))
		}
	}
	switch {
	case c.ToolVersion == "" || c.ToolVersion == parent.ToolVersion:
		c.ToolVersion = parent.ToolVersion
	case parent.ToolVersion == "":
	case strings.Contains(c.ToolVersion, "||") || strings.Contains(parent.ToolVersion, "||"):
		return Claims{}, widen("version range %q cannot be proven within %q", c.ToolVersion, parent.ToolVersion)
	default:
		c.ToolVersion = parent.ToolVersion + ", " + c.ToolVersion // both must hold
	}
	if len(c.AllowedOperations) == 0 {
		c.AllowedOperations = parent.AllowedOperations
	} else if len(parent.AllowedOperations) > 0 {
		for _, op := range c.AllowedOperations {
			if !slices.Contains(parent.AllowedOperations, op) {
				return Claims{}, widen("operation %q", op)
			}
		}
	}

	var err error
	if c.Filesystem, err = narrowFilesystem(parent.Filesystem, c.Filesystem); err != nil {
		return Claims{}, widen("%v", err)
	}
	if c.Network, err = narrowNetwork(parent.Network, c.Network); err != nil {
		return Claims{}, widen("%v", err)
	}
	if c.Credentials, err = narrowCredentials(parent.Credentials, c.Credentials); err != nil {
		return Claims{}, widen("%v", err)
	}
	for _, s := range parent.ExcludedSideEffects {
		if !slices.Contains(c.ExcludedSideEffects, s) {
			c.ExcludedSideEffects = append(c.ExcludedSideEffects, s)
		}
	}
	if len(c.PreApproved) == 0 {
		c.PreApproved = parent.PreApproved
	}
	for _, p := range c.PreApproved {
		if !parent.PreApproved.Match(p) {
			return Claims{}, widen("pre-approval of %q", p)
		}
	}
	if c.Budget, err = narrowBudget(parent.Budget, c.Budget); err != nil {
		return Claims{}, widen("%v", err)
	}

	switch {
	case c.ExpiresAt == nil:
		c.ExpiresAt = parent.ExpiresAt
	case parent.ExpiresAt != nil && c.ExpiresAt.After(parent.ExpiresAt.Time):
		return Claims{}, widen("expiry %s is after the parent's %s", c.ExpiresAt.UTC(), parent.ExpiresAt.UTC())
	}
	if parent.NotBefore != nil && (c.NotBefore == nil || c.NotBefore.Before(parent.NotBefore.Time)) {
		c.NotBefore = parent.NotBefore
	}
	return c, nil
}

func narrowFilesystem(parent, child *FilesystemGrant) (*FilesystemGrant, error) {
	if child == nil {
		return parent, nil
	}
	if parent == nil {
		return nil, fmt.Errorf("the parent grants no filesystem access")
	}
	if child.Mode == "" {
		child.Mode = "ro"
	}
	if child.Mode == "rw" && parent.Mode != "rw" {
		return nil, fmt.Errorf("write access where the parent grants read only")
	}
	for _, p := range child.AllowedPaths {
		cp, err := CleanPath(p)
		if err != nil {
			return nil, err
		}
		if !slices.ContainsFunc(parent.AllowedPaths, func(root string) bool {
			r, err := CleanPath(root)
			return err == nil && PathWithin(cp, r)
		}) {
			return nil, fmt.Errorf("path %s is outside %v", p, parent.AllowedPaths)
		}
	}
	return child, nil
}

func narrowNetwork(parent, child *NetworkGrant) (*NetworkGrant, error) {
	if child == nil {
		return parent, nil
	}
	if parent == nil {
		return nil, fmt.Errorf("the parent grants no network access")
	}
	for _, h := range child.AllowedHosts {
		if !slices.ContainsFunc(parent.AllowedHosts, func(p string) bool { return HostAllowed(p, h) || strings.EqualFold(p, h) }) {
			return nil, fmt.Errorf("host %s is not within %v", h, parent.AllowedHosts)
		}
	}
	if len(child.AllowedPorts) == 0 {
		child.AllowedPorts = parent.AllowedPorts
	} else if len(parent.AllowedPorts) > 0 {
		for _, p := range child.AllowedPorts {
			if !slices.Contains(parent.AllowedPorts, p) {
				return nil, fmt.Errorf("port %d is not within %v", p, parent.AllowedPorts)
			}
		}
	}
	return child, nil
}

func narrowCredentials(parent, child *CredentialGrant) (*CredentialGrant, error) {
	if child == nil {
		return parent, nil
	}
	if parent == nil {
		return nil, fmt.Errorf("the parent grants no credentials")
	}
	for _, s := range child.AllowedSecrets {
		if !slices.Contains(parent.AllowedSecrets, s) {
			return nil, fmt.Errorf("secret %s is not within %v", s, parent.AllowedSecrets)
		}
	}
	return child, nil
}

// narrowBudget keeps each limit at most the parent's; zero means unlimited
// in the parent and "inherit" in the child.
func narrowBudget(parent, child *Budget) (*Budget, error) {
	if child == nil {
		return parent, nil
	}
	out := *child
	if parent == nil {
		return &out, nil
	}
	ints := []struct {
		name string
		p    int64
		c    *int64
	}{
		{"max_calls", parent.MaxCalls, &out.MaxCalls},
		{"max_runtime_ms", parent.MaxRuntimeMS, &out.MaxRuntimeMS},
		{"max_tokens", parent.MaxTokens, &out.MaxTokens},
		{"approval_after_failures", parent.ApprovalAfterFailures, &out.ApprovalAfterFailures},
	}
	for _, f := range ints {
		switch {
		case *f.c == 0:
			*f.c = f.p
		case f.p != 0 && *f.c > f.p:
			return nil, fmt.Errorf("budget %s %d is over the parent's %d", f.name, *f.c, f.p)
		}
	}
	switch {
	case out.MaxCost == 0:
		out.MaxCost = parent.MaxCost
	case parent.MaxCost != 0 && out.MaxCost > parent.MaxCost:
		return nil, fmt.Errorf("budget max_cost %g is over the parent's %g", out.MaxCost, parent.MaxCost)
	}
	return &out, nil
}
