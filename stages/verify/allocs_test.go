package verify

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/toolgate/toolgate/internal/allocbudget"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages"
)

// allocBudgets are Process's allocations per call, building its input
// included, recorded: a change that allocates more than 20 % over one
// fails TestAllocationBudget.
var allocBudgets = map[string]float64{
	"small result": 76, // a few fields, nothing found
	"text result":  34, // a paragraph of prose scanned by every detector
}

func allocPaths(tb testing.TB) map[string]func() {
	tb.Helper()
	reg := tools.NewRegistry()
	reg.Put(&tools.Manifest{ID: "test:echo", Version: "1.0.0", Name: "echo", Kind: "builtin"})
	v := New(reg, Config{})
	// As a Runner calls it: the size of execute's hand-off is known.
	ctx := stages.WithInput(context.Background(), "TOOLGATE_PIPELINE", 1, 2048)
	run := func(result string) func() {
		return func() {
			inv := &envelope.Invocation{Route: &envelope.Route{ToolID: "test:echo", ToolVersion: "1.0.0"}, Result: json.RawMessage(result)}
			if _, err := v.Process(ctx, inv); err != nil {
				tb.Fatal(err)
			}
		}
	}
	return map[string]func(){
		"small result": run(`{"ok":true,"count":3,"name":"report"}`),
		"text result": run(`{"summary":"The quarterly report covers revenue, costs and the outlook for the next ` +
			`two quarters; the team met its targets and expects steady growth in the coming months."}`),
	}
}

func TestAllocationBudget(t *testing.T) { allocbudget.Check(t, allocBudgets, allocPaths(t)) }

// BenchmarkProcess is the stage's work per call, with its allocations.
func BenchmarkProcess(b *testing.B) { allocbudget.Bench(b, allocPaths(b)) }
