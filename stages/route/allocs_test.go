package route

import (
	"context"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/allocbudget"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tools"
)

// allocBudgets are Process's allocations per call, recorded: a change that
// allocates more than 20 % over one fails TestAllocationBudget.
var allocBudgets = map[string]float64{
	"latest":        2, // no version asked: the highest active one
	"range-limited": 8, // a version range, through a rate limiter
}

func allocPaths(tb testing.TB) map[string]func() {
	tb.Helper()
	reg := tools.NewRegistry()
	for _, v := range []string{"1.0.0", "1.2.0", "2.0.0"} {
		reg.Put(&tools.Manifest{ID: "echo", Version: v, Kind: "builtin"})
	}
	plain := New(reg, "builtin")
	limited := New(reg, "builtin")
	limited.Limits = fakeLimiter{ok: true}
	run := func(r *Router, version string) func() {
		return func() {
			inv := &envelope.Invocation{ID: "i", Tenant: "acme", Request: &api.Request{ToolID: "echo", ToolVersion: version}}
			if _, err := r.Process(context.Background(), inv); err != nil || inv.Route == nil {
				tb.Fatal(err)
			}
		}
	}
	return map[string]func(){
		"latest":        run(plain, ""),
		"range-limited": run(limited, "^1.0.0"),
	}
}

func TestAllocationBudget(t *testing.T) { allocbudget.Check(t, allocBudgets, allocPaths(t)) }

// BenchmarkProcess is the stage's work per call, with its allocations.
func BenchmarkProcess(b *testing.B) { allocbudget.Bench(b, allocPaths(b)) }
