package control

import (
	"context"

	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// SiteAdmin declares and removes sites where the hub keeps them
// (internal/node's, over the hub's data directory and its server).
type SiteAdmin interface {
	// AddSite declares site with the public halves of its keys and makes
	// its consumers; it answers what the site's bundle needs of the hub.
	AddSite(ctx context.Context, r api.SiteRequest) (api.SiteAdded, error)
	// RemoveSite removes site: its credentials are refused from then on
	// and its open leaf links cut.
	RemoveSite(ctx context.Context, site string) (api.SiteRemoved, error)
}

// WithSiteAdmin serves the site endpoints (tool.svc.sites.*) with s;
// without it they answer E3275.
func WithSiteAdmin(s SiteAdmin) Option { return func(h *handlers) { h.siteAdmin = s } }

// siteEndpoints are the operators' site endpoints.
func (h *handlers) siteEndpoints() map[string]micro.HandlerFunc {
	return map[string]micro.HandlerFunc{subjects.SvcSitesAdd: h.addSite, subjects.SvcSitesRemove: h.removeSite}
}

// siteRequest takes an operator's signed site request; on failure it has
// answered (and audited a refused signature) and ok is false.
func (h *handlers) siteRequest(req micro.Request, expected string) (r api.SiteRequest, who string, ok bool) {
	if who, ok = h.decodeAdmin(req, &r, func() string { return r.By }, expected); !ok {
		return r, "", false
	}
	if err := subjects.CheckSite(r.Site); err != nil {
		respondError(req, api.WrapError(err, api.InvalidParameters, api.EInvalidName, "%v", err))
		return r, "", false
	}
	if h.siteAdmin == nil {
		respondError(req, api.NewError(api.InvalidParameters, api.ESitesUnavailable,
			"this control service declares no sites: run it in the hub's serve (docs/sites.md)"))
		return r, "", false
	}
	return r, who, true
}

// addSite declares a site (or declares it again, with new keys).
func (h *handlers) addSite(req micro.Request) {
	r, who, ok := h.siteRequest(req, `{"site":…, "user_key":…, "signing_key":…}`)
	if !ok {
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	out, err := h.siteAdmin.AddSite(ctx, r)
	if err != nil {
		respondError(req, err)
		return
	}
	h.audited(ctx, req, api.TypeSiteAdded, api.AdminChange{Action: "sites.add", By: who, Target: r.Site,
		Details: map[string]any{"user_key": r.UserKey, "signing_key": r.SigningKey}}, out)
}

// removeSite removes a declared site (E3274 for any other).
func (h *handlers) removeSite(req micro.Request) {
	r, who, ok := h.siteRequest(req, `{"site":…}`)
	if !ok {
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	out, err := h.siteAdmin.RemoveSite(ctx, r.Site)
	if err != nil {
		respondError(req, err)
		return
	}
	h.audited(ctx, req, api.TypeSiteRemoved, api.AdminChange{Action: "sites.remove", By: who, Target: r.Site,
		Details: map[string]any{"links_cut": out.LinksCut}}, out)
}
