package api

// BudgetsRequest asks for the sessions nearest their caps (the control
// service's budgets.list, operators only).
type BudgetsRequest struct {
	// TenantID limits the list to one tenant; empty lists every tenant.
	TenantID string `json:"tenant_id,omitempty"`
	// Near is the share of a cap (0 to 1) a session must have used of at
	// least one of its capped quantities to be listed; 0 lists every
	// capped session.
	Near float64 `json:"near,omitempty"`
	// Limit bounds the list (default and at most 100).
	Limit int `json:"limit,omitempty"`
}

// BudgetsResponse lists sessions nearest their caps first.
type BudgetsResponse struct {
	Budgets []BudgetStatus `json:"budgets"`
}

// UsedShare is the largest share of a cap the session has used, and which
// quantity that is ("" and 0 when nothing is capped). A quantity at its cap
// is 1.
func (s BudgetStatus) UsedShare() (share float64, quantity string) {
	for _, q := range []struct {
		name       string
		used, capv float64
	}{
		{"calls", float64(s.Used.Calls), float64(s.Limits.MaxCalls)},
		{"runtime_ms", float64(s.Used.RuntimeMS), float64(s.Limits.MaxRuntimeMS)},
		{"cost", s.Used.Cost, s.Limits.MaxCost},
		{"tokens", float64(s.Used.Tokens), float64(s.Limits.MaxTokens)},
	} {
		if q.capv <= 0 {
			continue
		}
		if f := min(q.used/q.capv, 1); quantity == "" || f > share {
			share, quantity = f, q.name
		}
	}
	return share, quantity
}
