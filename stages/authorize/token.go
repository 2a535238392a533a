package authorize

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
)

// linked returns the principal of an invocation a hook started: the
// verified claims of the invocation whose end fired the hook, provided the
// decision recorded there describes this request exactly (id, tool,
// version, parameters, agent, link) and the request carries no token of its
// own. The claims must still be unexpired; policy, approval and budget then
// judge the call like any other.
func (a *Authorizer) linked(ctx context.Context, inv *envelope.Invocation) (*token.Claims, error) {
	req := inv.Request
	refuse := func(format string, args ...any) error {
		return api.NewError(api.PermissionDenied, api.ELinkRefused, "link to %s refused: "+format,
			append([]any{req.Link.Parent}, args...)...)
	}
	if req.CapabilityToken != "" {
		return nil, refuse("a linked request carries no token of its own")
	}
	if a.cfg.Decisions == nil {
		return nil, refuse("hooks are not enabled on this worker")
	}
	d, err := a.cfg.Decisions.HookDecisionOf(ctx, inv.Tenant, req.Link.Parent)
	if errors.Is(err, kvstore.ErrNoHookDecision) {
		return nil, refuse("no hook decided to start it")
	}
	if err != nil {
		return nil, stages.Transient(err, 0)
	}
	c := d.Child
	if c == nil || c.ID != inv.ID {
		return nil, refuse("the hook started another invocation")
	}
	if !sameChild(c.Request, *req) {
		return nil, refuse("the request differs from the one the hook decided")
	}
	if a.cfg.DecisionSigned != nil {
		text, err := kvstore.DecisionText(d)
		if err != nil || !a.cfg.DecisionSigned(text, d.Sig) {
			return nil, api.NewError(api.PermissionDenied, api.ERecordUnsigned,
				"link to %s refused: the hook's decision is not signed by the audit stage", req.Link.Parent)
		}
	}
	if len(c.Claims) == 0 {
		return nil, refuse("the parent had no verified capability token")
	}
	claims := new(token.Claims)
	if err := json.Unmarshal(c.Claims, claims); err != nil {
		return nil, refuse("undecodable claims: %v", err)
	}
	if exp := claims.ExpiresAt; exp == nil || !a.cfg.Now().Before(exp.Time) {
		return nil, api.NewError(api.PermissionDenied, api.ETokenExpired, "the capability token of %s has expired", req.Link.Parent)
	}
	return claims, nil
}

// sameChild reports whether req asks for what the hook decided.
func sameChild(want, req api.Request) bool {
	if want.ToolID != req.ToolID || want.ToolVersion != req.ToolVersion || want.AgentContext != req.AgentContext ||
		want.Link == nil || *want.Link != *req.Link {
		return false
	}
	return compactJSON(want.Parameters) == compactJSON(req.Parameters)
}

func compactJSON(b []byte) string {
	var v any
	if len(b) == 0 || json.Unmarshal(b, &v) != nil {
		return "{}"
	}
	out, _ := json.Marshal(v) // map keys sorted
	return string(out)
}

func redactToken(req *api.Request) *api.Request {
	r := *req
	r.CapabilityToken = "" // a policy never needs the raw token
	return &r
}

// cleanGrants returns c with its granted paths in token.CleanPath's form, the
// form resources gives the paths a call needs, so the policy compares like
// with like whichever spelling the token uses. Verify refused paths that do
// not clean.
func cleanGrants(c *token.Claims) *token.Claims {
	if c.Filesystem == nil {
		return c
	}
	out, fs := *c, *c.Filesystem
	fs.AllowedPaths = make([]string, 0, len(c.Filesystem.AllowedPaths))
	for _, p := range c.Filesystem.AllowedPaths {
		if cp, err := token.CleanPath(p); err == nil {
			fs.AllowedPaths = append(fs.AllowedPaths, cp)
		}
	}
	out.Filesystem = &fs
	return &out
}

func grants(c *token.Claims) envelope.Grants {
	var g envelope.Grants
	if f := cleanGrants(c).Filesystem; f != nil {
		g.Paths, g.PathMode = f.AllowedPaths, cmp.Or(f.Mode, "ro")
	}
	if n := c.Network; n != nil {
		g.Hosts, g.Ports = n.AllowedHosts, n.AllowedPorts
	}
	if cr := c.Credentials; cr != nil {
		g.Secrets = cr.AllowedSecrets
	}
	return g
}
