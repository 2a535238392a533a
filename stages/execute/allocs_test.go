package execute

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/allocbudget"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/stages/execute/builtin"
)

// allocBudgets are Process's allocations per call, building its input
// included, recorded: a change that allocates more than 20 % over one
// fails TestAllocationBudget. The tool is a builtin that returns its
// parameters, so the counts are execute's own, quota included.
var allocBudgets = map[string]float64{
	"builtin": 64, // a first delivery: claimed, run, result recorded
	// The same of an idempotent tool: its record read, not claimed (a
	// quick call's never is).
	"builtin idempotent": 63,
}

func allocPaths(tb testing.TB) map[string]func() {
	tb.Helper()
	reg := tools.NewRegistry()
	reg.Put(&tools.Manifest{ID: "echo", Version: "1.0.0", Kind: "builtin", Builtin: &tools.BuiltinConfig{Function: "echo"}})
	reg.Put(&tools.Manifest{ID: "again", Version: "1.0.0", Kind: "builtin", Builtin: &tools.BuiltinConfig{Function: "echo"},
		Safety: tools.Safety{Idempotent: true}})
	builtins := builtin.Set{"echo": func(_ context.Context, p json.RawMessage) (json.RawMessage, error) { return p, nil }}
	st := newFakeStore()
	x := &Executor{reg: reg, builtins: builtins, store: st, running: NewRunning(), Quota: NewTenantQuota(256, 0)}
	ctx := stages.WithDelivery(context.Background(), 1, 5)
	call := func(tool string) func() {
		return func() {
			delete(st.records, "i-1")
			inv := &envelope.Invocation{ID: "i-1", Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: 5},
				Request: &api.Request{ToolID: tool, Parameters: json.RawMessage(`{"x":1}`)},
				Route:   &envelope.Route{ToolID: tool, ToolVersion: "1.0.0", Executor: "builtin"}}
			if _, err := x.Process(ctx, inv); err != nil || inv.Status != api.StatusRunning {
				tb.Fatalf("status %s, %v", inv.Status, err)
			}
		}
	}
	return map[string]func(){"builtin": call("echo"), "builtin idempotent": call("again")}
}

func TestAllocationBudget(t *testing.T) { allocbudget.Check(t, allocBudgets, allocPaths(t)) }

// BenchmarkProcess is the stage's work per call, with its allocations.
func BenchmarkProcess(b *testing.B) { allocbudget.Bench(b, allocPaths(b)) }
