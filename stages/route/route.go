// Package route is the third stage: it pins the tool version an invocation
// runs, applies the version lifecycle, and chooses the executor.
package route

import (
	"context"
	"fmt"
	"time"

	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/stages/invocation"
	"github.com/toolgate/toolgate/stages/ratelimit"
	"github.com/toolgate/toolgate/stages/toolerr"
	"github.com/toolgate/toolgate/stages/tools"
)

// Router implements the route stage.
type Router struct {
	reg   *tools.Registry
	kinds map[string]bool
	// Limits, when set, holds calls to their tool's rate limit: the last
	// check before execute.
	Limits *ratelimit.Limiter
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
func (r *Router) Process(ctx context.Context, inv *invocation.Invocation) ([]stages.Output, error) {
	req := inv.Request
	m, err := r.reg.Resolve(req.ToolID, req.ToolVersion)
	if err != nil {
		return nil, err
	}
	switch m.Lifecycle.State {
	case tools.StateRemoved:
		return nil, toolerr.New(toolerr.ToolVersionNotFound, toolerr.EToolRemoved,
			"%s has been removed%s", m.Key(), successor(m))
	case tools.StateDeprecated, tools.StateSunset:
		inv.Metadata.Warnings = append(inv.Metadata.Warnings,
			fmt.Sprintf("%s: %s is %s%s", toolerr.EToolDeprecated, m.Key(), m.Lifecycle.State, successor(m)))
	}
	if !r.kinds[m.Kind] {
		return nil, toolerr.New(toolerr.ToolExecutionError, toolerr.EExecutorUnavailable,
			"no executor for %s tools in this deployment", m.Kind)
	}
	if r.Limits != nil {
		ok, wait, err := r.Limits.Allow(ctx, inv.Tenant, m)
		if err != nil {
			return nil, stages.Transient(err, 0)
		}
		if !ok {
			return nil, toolerr.New(toolerr.RateLimitExceeded, toolerr.ERateLimited,
				"%s is over its rate limit for tenant %s; retry in %v", m.ID, inv.Tenant, wait.Round(time.Millisecond)).
				AsRetryable().WithDetail("retry_after_ms", wait.Milliseconds())
		}
	}
	inv.Route = &invocation.Route{ToolID: m.ID, ToolVersion: m.Version, Executor: m.Kind}
	inv.Metadata.Executor = m.Kind
	return nil, nil
}

func successor(m *tools.Manifest) string {
	if s := m.Lifecycle.DeprecatedInFavorOf; s != "" {
		return "; use " + s
	}
	return ""
}
