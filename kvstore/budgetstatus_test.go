package kvstore

import (
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
)

func TestBudgetStatus(t *testing.T) {
	start := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	u := Usage{Calls: 10, Tokens: 4000, Cost: 1, StartedAt: start}
	st := u.Status("t", "s", api.BudgetLimits{MaxTokens: 10000, MaxCost: 1, MaxCalls: 100}, start.Add(2*time.Hour))
	if st.Remaining["tokens"] != 6000 || st.PerHour["tokens"] != 2000 {
		t.Fatalf("remaining %v, per hour %v", st.Remaining, st.PerHour)
	}
	if len(st.Exhausted) != 1 || st.Exhausted[0] != "cost" {
		t.Fatalf("exhausted %v", st.Exhausted)
	}
	// Tokens: 6000 left at 2000/h is 3 h; calls: 90 at 5/h is 18 h.
	if st.DepletesFirst != "tokens" || st.Depletes != start.Add(5*time.Hour).Format(time.RFC3339) {
		t.Fatalf("depletes %s first %s", st.Depletes, st.DepletesFirst)
	}
	if st := (Usage{}).Status("t", "s", api.BudgetLimits{}, start); st.Depletes != "" || len(st.Remaining) != 0 {
		t.Fatalf("an empty session: %+v", st)
	}
}
