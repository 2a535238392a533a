package kvstore

import (
	"time"

	"github.com/toolgate/toolgate/api"
)

// Status reports u against a budget's limits at now.
func (u Usage) Status(tenant, session string, l api.BudgetLimits, now time.Time) api.BudgetStatus {
	st := api.BudgetStatus{Tenant: tenant, Session: session, Limits: l,
		Remaining: map[string]float64{}, PerHour: map[string]float64{}}
	st.Used.Calls, st.Used.RuntimeMS, st.Used.Cost, st.Used.Tokens = u.Made(), u.RuntimeMS, u.Cost, u.Tokens
	hours := 0.0
	if !u.StartedAt.IsZero() {
		// At least a minute, so one early charge does not project an
		// absurd rate.
		hours = max(now.Sub(u.StartedAt), time.Minute).Hours()
	}
	var soonest time.Duration = -1
	for _, q := range []struct {
		name       string
		used, capv float64
	}{
		{"calls", float64(u.Made()), float64(l.MaxCalls)},
		{"runtime_ms", float64(u.RuntimeMS), float64(l.MaxRuntimeMS)},
		{"cost", u.Cost, l.MaxCost},
		{"tokens", float64(u.Tokens), float64(l.MaxTokens)},
	} {
		rate := 0.0
		if hours > 0 {
			rate = q.used / hours
			st.PerHour[q.name] = rate
		}
		if q.capv <= 0 {
			continue
		}
		left := max(q.capv-q.used, 0)
		st.Remaining[q.name] = left
		if left == 0 {
			st.Exhausted = append(st.Exhausted, q.name)
			continue
		}
		if rate > 0 {
			d := time.Duration(left / rate * float64(time.Hour))
			if soonest < 0 || d < soonest {
				soonest, st.DepletesFirst = d, q.name
			}
		}
	}
	if soonest >= 0 {
		st.Depletes = now.Add(soonest).UTC().Format(time.RFC3339)
	}
	return st
}
