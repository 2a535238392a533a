package node

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/signedstate"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages/authorize"
)

// ShadowMetrics counts the calls on which the candidate policy decided
// otherwise than the live one (docs/authorization.md).
type ShadowMetrics struct {
	diverged *prometheus.CounterVec
}

// NewShadowMetrics registers the series on reg.
func NewShadowMetrics(reg prometheus.Registerer) *ShadowMetrics {
	m := &ShadowMetrics{diverged: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "toolgate", Subsystem: "policy", Name: "shadow_diverged_total",
		Help: "Calls on which the candidate (shadow) policy decided otherwise than the live one, by tool, tenant and the candidate's decision (allow, deny, approval).",
	}, []string{"tool", "tenant", "candidate"})}
	reg.MustRegister(m.diverged)
	return m
}

func (m *ShadowMetrics) observe(d api.ShadowDivergence) {
	if m == nil {
		return
	}
	cand := "deny"
	switch {
	case d.Candidate.Allow && d.Candidate.RequiresApproval:
		cand = "approval"
	case d.Candidate.Allow:
		cand = "allow"
	}
	m.diverged.WithLabelValues(d.ToolID, d.TenantID, cand).Inc()
}

// watchShadow keeps a's candidate policy the one pushed, honouring only a
// candidate an operator signed (on an authenticated bus).
func (n *Node) watchShadow(ctx context.Context, a *authorize.Authorizer, c StageConfig) error {
	return n.Store.WatchShadowPolicy(ctx, func(b kvstore.PolicyBundle, ok bool, err error) {
		if !ok {
			a.SetShadow(nil, 0)
			n.Log.Info("shadow policy dropped")
			return
		}
		if err == nil && c.StateProof != nil {
			if err := signedstate.ShadowPolicy(b, c.StateProof); err != nil {
				n.refusedState(ctx, "urn:toolgate:authorize", "shadow policy", b.Revision, err)
				return
			}
		}
		var e *policy.Engine
		if err == nil {
			e, err = policy.New(ctx, b.Modules, b.Data)
		}
		if err != nil {
			n.Log.Error("shadow policy does not load; keeping the current one", "revision", b.Revision, "err", err)
			return
		}
		a.SetShadow(e, b.Revision)
		n.Log.Info("shadow policy loaded", "revision", b.Revision, "modules", len(b.Modules))
	})
}
