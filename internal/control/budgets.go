package control

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// maxBudgets bounds a budgets.list answer.
const maxBudgets = 100

// listBudgets answers the capped sessions that have used at least r.Near
// of a cap, nearest first: the caps are the ones the session's latest call
// was admitted against (kvstore.Usage.Limits).
func (h *handlers) listBudgets(req micro.Request) {
	var r api.BudgetsRequest
	if _, ok := h.decodeAdmin(req, &r, func() string { return "" }, `{"tenant_id"?, "near"?, "limit"?}`); !ok {
		return
	}
	if r.TenantID != "" {
		if err := subjects.CheckTenant(r.TenantID); err != nil {
			respondError(req, api.WrapError(err, api.InvalidParameters, api.EInvalidName, "%v", err))
			return
		}
	}
	limit := r.Limit
	if limit <= 0 || limit > maxBudgets {
		limit = maxBudgets
	}
	ctx, cancel := adminContext()
	defer cancel()
	all, err := h.admin.Budgets(ctx, r.TenantID)
	if err != nil {
		respondError(req, err)
		return
	}
	now := time.Now()
	type near struct {
		st    api.BudgetStatus
		share float64
	}
	var ns []near
	for _, s := range all {
		st := s.Usage.Status(s.Tenant, s.Session, s.Usage.Limits, now)
		share, q := st.UsedShare()
		if q == "" || share < r.Near {
			continue
		}
		ns = append(ns, near{st, share})
	}
	slices.SortFunc(ns, func(a, b near) int {
		return cmp.Or(cmp.Compare(b.share, a.share), strings.Compare(a.st.Tenant, b.st.Tenant), strings.Compare(a.st.Session, b.st.Session))
	})
	out := api.BudgetsResponse{Budgets: []api.BudgetStatus{}}
	for _, n := range ns[:min(len(ns), limit)] {
		out.Budgets = append(out.Budgets, n.st)
	}
	_ = req.RespondJSON(out)
}
