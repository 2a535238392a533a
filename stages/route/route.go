// Package route is the third stage: it pins the tool version an invocation
// runs, applies the version lifecycle, and chooses the executor.
package route

import (
	"context"
	"fmt"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/ratelimit"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages"
)

// limiter spends one call of an agent's rate limit for a tool
// (*ratelimit.Limiter): false with how long until one is expected when none
// is left. An invocation that may have been given one before (again) is
// given none twice.
type limiter interface {
	AllowCall(ctx context.Context, tenant, agent string, m *tools.Manifest, id string, again bool) (bool, time.Duration, error)
	// Applies names the limit a refusal is over, and whose it is.
	Applies(tenant, agent string, m *tools.Manifest) (lim tools.RateLimit, source string, ok bool)
}

var _ limiter = (*ratelimit.Limiter)(nil)

// Router implements the route stage.
type Router struct {
	reg   *tools.Registry
	kinds map[string]bool
	// Limits, when set, holds calls to their tool's rate limit: the last
	// check before execute.
	Limits limiter
	// SiteWait, when set, bounds how long a call for a site's tool may
	// wait at the hub for the site (Route.SiteDeadline).
	SiteWait time.Duration
	// SiteDeclared, when set, reports whether a site is declared: a call
	// for the tool of a site removed since it was registered has nowhere
	// to run, and ends here (E3273) rather than wait for ever.
	SiteDeclared func(site string) bool
}

var _ stages.Stage = (*Router)(nil)

// New returns a Router that sends tools of the given kinds to execute.
func New(reg *tools.Registry, kinds ...string) *Router {
	r := &Router{reg: reg, kinds: map[string]bool{}}
	for _, k := range kinds {
		r.kinds[k] = true
	}
	return r
}

// Process implements stages.Stage.
func (r *Router) Process(ctx context.Context, inv *envelope.Invocation) ([]stages.Output, error) {
	req := inv.Request
	// Authorize resolved the version it admitted and sealed it: route
	// keeps to that one, even if a newer version matching the request was
	// registered in between.
	version := req.ToolVersion
	if inv.Authz != nil && inv.Authz.Seal != nil {
		version = inv.Authz.Seal.ToolVersion
	}
	m, err := r.reg.Resolve(req.ToolID, version)
	if err != nil {
		return nil, err
	}
	state := m.State(time.Now())
	switch state {
	case tools.StateRemoved:
		return nil, api.NewError(api.ToolVersionNotFound, api.EToolRemoved,
			"%s has been removed%s", m.Key(), successor(m))
	case tools.StateDeprecated, tools.StateSunset:
		inv.Metadata.Warnings = append(inv.Metadata.Warnings,
			fmt.Sprintf("%s: %s is %s%s", api.EToolDeprecated, m.Key(), state, successor(m)))
	}
	if m.Site != "" && r.SiteDeclared != nil && !r.SiteDeclared(m.Site) {
		return nil, api.NewError(api.ToolExecutionError, api.ESiteRemoved,
			"%s runs at site %q, which this deployment no longer declares (toolgate site remove)", m.Key(), m.Site).WithDetail("site", m.Site)
	}
	if !r.kinds[m.Kind] {
		return nil, api.NewError(api.ToolExecutionError, api.EExecutorUnavailable,
			"no executor for %s tools in this deployment", m.Kind)
	}
	// A dry run takes no token of the rate limit: it would be a call
	// counted that never ran.
	if r.Limits != nil && !req.DryRun() {
		ok, wait, err := r.Limits.AllowCall(ctx, inv.Tenant, inv.Agent(), m, inv.ID, inv.Again)
		if err != nil {
			return nil, stages.Transient(err, 0)
		}
		if !ok {
			lim, source, _ := r.Limits.Applies(inv.Tenant, inv.Agent(), m)
			return nil, api.NewError(api.RateLimitExceeded, api.ERateLimited,
				"%s is over its rate limit for tenant %s (agent %s): %s; retry in %v", m.ID, inv.Tenant, inv.Agent(),
				describeLimit(lim, source), wait.Round(time.Millisecond)).
				AsRetryable().WithDetail("retry_after_ms", wait.Milliseconds()).
				WithDetail("rate_limit", map[string]any{"requests": lim.Requests, "per_seconds": lim.PerSeconds,
					"burst": max(lim.Burst, lim.Requests), "source": source})
		}
	}
	inv.Route = &envelope.Route{ToolID: m.ID, ToolVersion: m.Version, Executor: m.Kind, Site: m.Site}
	if m.Site != "" && r.SiteWait > 0 {
		inv.Route.SiteDeadline = time.Now().Add(r.SiteWait)
	}
	inv.Metadata.Executor = m.Kind
	if p := inv.Metadata.DryRunPlan; p != nil && req.DryRun() {
		p.Route = &api.DryRunRoute{ToolID: m.ID, ToolVersion: m.Version, Executor: m.Kind}
	}
	return nil, nil
}

// describeLimit says which limit a call is over: a default that applies
// where the manifest is silent is easily taken for the manifest's own.
func describeLimit(lim tools.RateLimit, source string) string {
	whose := "its manifest's, for the tenant's agents together"
	switch source {
	case ratelimit.SourceOverride:
		whose = "the tenant's override of its manifest's, for the tenant's agents together"
	case ratelimit.SourceDefault:
		whose = "the default for each agent, as its manifest declares none"
	}
	return fmt.Sprintf("%d per %d s, burst %d, %s", lim.Requests, max(1, lim.PerSeconds), max(lim.Burst, lim.Requests), whose)
}

func successor(m *tools.Manifest) string {
	if s := m.Lifecycle.DeprecatedInFavorOf; s != "" {
		return "; use " + s
	}
	return ""
}
