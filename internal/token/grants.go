package token

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/hosts"
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
		return api.NewError(api.PermissionDenied, api.ENotGranted, format, args...)
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

// CleanPath is toolgate's one path normaliser. Granted paths (token
// filesystem_permissions) and path parameters are both relative to the file
// root, and a leading "/" means the same as none: "public", "/public",
// "./public" and "public/" are one path. CleanPath returns the canonical form
// authorize and the policy compare, "/public" ("/" is the whole root); the fs
// builtins open RootRelative's form of the same. ".." is refused, never
// clamped, so a path never lands somewhere other than where it reads.
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

// RootRelative is CleanPath's result as a name to open under the file root:
// "public/readme.txt", or "." for the root itself.
func RootRelative(p string) (string, error) {
	c, err := CleanPath(p)
	if err != nil {
		return "", err
	}
	if c == "/" {
		return ".", nil
	}
	return c[1:], nil
}

// PathWithin reports whether p lies in root, comparing whole components:
// /data_evil is not within /data.
func PathWithin(p, root string) bool {
	return root == "/" || p == root || strings.HasPrefix(p, root+"/")
}

// HostAllowed reports whether host matches pattern (hosts.Match).
func HostAllowed(pattern, host string) bool { return hosts.Match(pattern, host) }
