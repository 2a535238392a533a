package audit

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/allocbudget"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// allocBudgets are Process's allocations per call, building its input
// included, recorded: a change that allocates more than 20 % over one
// fails TestAllocationBudget.
var allocBudgets = map[string]float64{
	"succeeded": 25, // a success: status, terminal event and result
	"admitted":  29, // the same, in a session whose usage it settles
}

// plainStore stores nothing and allocates nothing, so the counts are the
// stage's own.
type plainStore struct{}

func (plainStore) Status(context.Context, string, string) (api.Record, error) {
	return api.Record{}, api.ErrInvocationNotFound
}

func (plainStore) SetStatus(_ context.Context, rec api.Record) (api.Record, bool, error) {
	return rec, true, nil
}

func (plainStore) UpdateUsage(_ context.Context, _, _ string, change func(*kvstore.Usage) error) (kvstore.Usage, error) {
	var u kvstore.Usage
	return u, change(&u)
}

func allocPaths(tb testing.TB) map[string]func() {
	tb.Helper()
	a := &Auditor{store: plainStore{}}
	run := func(admitted bool) func() {
		return func() {
			inv := &envelope.Invocation{ID: "i-1", Tenant: "acme", Event: envelope.Event{Seq: 7}, Status: api.StatusPending,
				Request: &api.Request{ToolID: "echo"}}
			inv.Succeed(subjects.Verify, json.RawMessage(`{"ok":true}`))
			if admitted {
				inv.Authz = &envelope.Authorization{Session: "s", Reserved: true, CostPerCall: 0.5}
				inv.Metadata.DurationMS, inv.Metadata.StartedAt = 40, "2026-01-01T00:00:00Z"
			}
			if outs, err := a.Process(context.Background(), inv); err != nil || len(outs) != 2 {
				tb.Fatalf("%d outputs, %v", len(outs), err)
			}
		}
	}
	return map[string]func(){"succeeded": run(false), "admitted": run(true)}
}

func TestAllocationBudget(t *testing.T) { allocbudget.Check(t, allocBudgets, allocPaths(t)) }

// BenchmarkProcess is the stage's work per call, with its allocations.
func BenchmarkProcess(b *testing.B) { allocbudget.Bench(b, allocPaths(b)) }
