package token

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"

	"github.com/toolgate/toolgate/stages/toolerr"
)

// Binding is who is calling what: the facts a token must cover before the
// policy is asked anything.
type Binding struct {
	Tenant      string
	AgentDID    string
	SessionID   string
	ToolID      string
	ToolVersion string // the resolved version
}

// Grants checks that the token covers b. A mismatch is permission_denied
// with E3210.
func (c *Claims) Grants(b Binding) error {
	deny := func(format string, args ...any) error {
		return toolerr.New(toolerr.PermissionDenied, toolerr.ENotGranted, format, args...)
	}
	switch {
	case c.TenantID != b.Tenant:
		return deny("the capability token is for tenant %q, not %q", c.TenantID, b.Tenant)
	case c.AgentDID != b.AgentDID:
		return deny("the capability token is for agent %q, not %q", c.AgentDID, b.AgentDID)
	case c.SessionID != "" && c.SessionID != b.SessionID:
		return deny("the capability token is for session %q, not %q", c.SessionID, b.SessionID)
	case !c.ToolID.Match(b.ToolID):
		return deny("the capability token does not grant tool %s", b.ToolID)
	case len(c.AllowedOperations) > 0 && !slices.Contains(c.AllowedOperations, OperationExecute):
		return deny("the capability token does not allow the %s operation", OperationExecute)
	}
	if c.ToolVersion != "" {
		rng, _ := parseRange(c.ToolVersion) // checked by Verify
		v, err := semver.StrictNewVersion(b.ToolVersion)
		if err != nil || rng == nil || !rng.Check(v) {
			return deny("the capability token grants %s only in versions %s, not %s", b.ToolID, c.ToolVersion, b.ToolVersion)
		}
	}
	return nil
}

func parseRange(s string) (*semver.Constraints, error) {
	c, err := semver.NewConstraint(s)
	if err != nil {
		return nil, fmt.Errorf("tool_version %q: %w", s, err)
	}
	return c, nil
}

// CleanPath normalises a granted or requested path to an absolute, clean
// form relative to the file root ("/" is the whole root). ".." that would
// climb above the root is refused rather than clamped.
func CleanPath(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("empty path")
	}
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("path %q contains NUL", p)
	}
	rel := strings.TrimPrefix(p, "/")
	for _, seg := range strings.Split(rel, "/") {
		if seg == ".." {
			return "", fmt.Errorf("path %q climbs out through a parent segment", p)
		}
	}
	return path.Clean("/" + rel), nil
}

// PathWithin reports whether p lies in root, comparing whole components:
// /data_evil is not within /data.
func PathWithin(p, root string) bool {
	return root == "/" || p == root || strings.HasPrefix(p, root+"/")
}

// HostAllowed reports whether host matches pattern: equal, or pattern
// "*.example.com" and host a subdomain of example.com.
func HostAllowed(pattern, host string) bool {
	pattern, host = strings.ToLower(pattern), strings.ToLower(host)
	if suffix, ok := strings.CutPrefix(pattern, "*."); ok {
		return strings.HasSuffix(host, "."+suffix)
	}
	return pattern == host
}
