package validate

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/internal/allocbudget"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tools"
)

// allocBudgets are the stage's allocations per call, recorded: a change
// that allocates more than 20 % over one fails TestAllocationBudget.
var allocBudgets = map[string]float64{
	"process": 6, // a binary-mode event, decoded before the count starts
	"decode":  6, // reading that event into an invocation (Decode)
}

func allocPaths(tb testing.TB) map[string]func() {
	tb.Helper()
	m, err := tools.Parse([]byte(`{"id":"echo","name":"echo","version":"1.0.0","description":"echoes","kind":"builtin",
	  "builtin":{"function":"echo"},"output_schema":{"type":"object"},
	  "input_schema":{"type":"object","required":["message"],"properties":{"message":{"type":"string"}}}}`))
	if err != nil {
		tb.Fatal(err)
	}
	reg := tools.NewRegistry()
	reg.Put(m)
	v := New(reg, Config{})
	h := nats.Header{}
	h.Set("ce-specversion", "1.0")
	h.Set("ce-id", "inv-1")
	h.Set("ce-source", "urn:agent:a")
	h.Set("ce-type", envelope.EventType)
	h.Set("content-type", "application/json")
	body := []byte(`{"tool_id":"echo","agent_context":{"agent_did":"did:agent:a","tenant_id":"acme"},"parameters":{"message":"hi"}}`)
	now := time.Now()
	decode := func() *envelope.Invocation {
		inv, err := v.Decode("tool.invoke.acme", h, body, 7, now)
		if err != nil {
			tb.Fatal(err)
		}
		return inv
	}
	// Process takes the decoded request from inv.Data: each call gets a
	// fresh invocation, made ahead so the count is Process's alone.
	fresh := make(chan *envelope.Invocation, 1)
	fresh <- decode()
	return map[string]func(){
		"decode": func() { decode() },
		"process": func() {
			inv := <-fresh
			if _, err := v.Process(context.Background(), inv); err != nil || inv.Request == nil {
				tb.Fatal(err)
			}
			// Rewind the invocation for the next call without allocating.
			inv.Data, inv.Request = body, nil
			fresh <- inv
		},
	}
}

func TestAllocationBudget(t *testing.T) { allocbudget.Check(t, allocBudgets, allocPaths(t)) }

// BenchmarkProcess is the stage's work per call, with its allocations.
func BenchmarkProcess(b *testing.B) { allocbudget.Bench(b, allocPaths(b)) }
