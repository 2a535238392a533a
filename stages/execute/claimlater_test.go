package execute

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages/execute/builtin"
)

// A call of an idempotent tool is not claimed before it starts, on a real
// bucket: a quick one leaves its record as validate claimed it (no write
// between the claim of the id and the ending), a long one says running
// while it runs, and what the claim would have found still counts (a
// cancel asked before the run, an ending recorded before a redelivery). A
// tool that is not idempotent is claimed before it starts, as ever.
func TestRunClaimedLaterWhenIdempotent(t *testing.T) {
	_, js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := kvstore.Open(ctx, js, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := js.KeyValue(ctx, kvstore.BucketInvocations)
	if err != nil {
		t.Fatal(err)
	}
	reg := tools.NewRegistry()
	put := func(id string, idempotent bool) {
		reg.Put(&tools.Manifest{ID: id, Version: "1.0.0", Kind: "builtin", Builtin: &tools.BuiltinConfig{Function: id},
			Safety: tools.Safety{Idempotent: idempotent}})
	}
	put("quick", true)
	put("long", true)
	put("once", false)
	var runs atomic.Int32
	statusWhileRunning := make(chan api.Status, 1)
	builtins := builtin.Set{
		"quick": func(context.Context, json.RawMessage) (json.RawMessage, error) {
			runs.Add(1)
			return json.RawMessage(`{}`), nil
		},
		"long": func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			runs.Add(1)
			time.Sleep(3 * invokedGrace)
			rec, err := st.Status(ctx, "acme", "long-1")
			if err != nil {
				return nil, err
			}
			statusWhileRunning <- rec.Status
			return json.RawMessage(`{}`), nil
		},
		"once": func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			rec, err := st.Status(ctx, "acme", "once-1")
			if err != nil {
				return nil, err
			}
			statusWhileRunning <- rec.Status
			return json.RawMessage(`{}`), nil
		},
	}
	x := &Executor{reg: reg, builtins: builtins, store: st, running: NewRunning()}
	// The call as validate hands it on: its id claimed, at ingest seq.
	call := func(tool, id string, seq uint64) (*envelope.Invocation, uint64) {
		t.Helper()
		if _, _, err := st.ClaimInvocation(ctx, "acme", id, seq, "digest", "did:agent:a", tool, ""); err != nil {
			t.Fatal(err)
		}
		e, err := bucket.Get(ctx, "acme."+id)
		if err != nil {
			t.Fatal(err)
		}
		return &envelope.Invocation{ID: id, Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: seq},
			Request: &api.Request{ToolID: tool, Parameters: json.RawMessage(`{}`),
				AgentContext: api.AgentContext{AgentDID: "did:agent:a", TenantID: "acme"}},
			Route: &envelope.Route{ToolID: tool, ToolVersion: "1.0.0", Executor: "builtin"}}, e.Revision()
	}
	revision := func(id string) uint64 {
		t.Helper()
		e, err := bucket.Get(ctx, "acme."+id)
		if err != nil {
			t.Fatal(err)
		}
		return e.Revision()
	}

	inv, claimed := call("quick", "quick-1", 1)
	if _, err := x.Process(ctx, inv); err != nil || inv.Error != nil {
		t.Fatalf("quick: %v %v", err, inv.Error)
	}
	if got := revision("quick-1"); got != claimed || runs.Load() != 1 {
		t.Fatalf("quick: the record is at revision %d after the run (claimed at %d), tool ran %d times; want no write and one run",
			got, claimed, runs.Load())
	}

	inv, _ = call("long", "long-1", 2)
	if _, err := x.Process(ctx, inv); err != nil || inv.Error != nil {
		t.Fatalf("long: %v %v", err, inv.Error)
	}
	if got := <-statusWhileRunning; got != api.StatusRunning {
		t.Fatalf("long: status %q while it ran past the grace, want running", got)
	}

	inv, _ = call("once", "once-1", 3)
	if _, err := x.Process(ctx, inv); err != nil || inv.Error != nil {
		t.Fatalf("once: %v %v", err, inv.Error)
	}
	if got := <-statusWhileRunning; got != api.StatusRunning {
		t.Fatalf("once: status %q as it started, want running (claimed before the start)", got)
	}

	// A cancel asked before the run is found by the read.
	inv, _ = call("quick", "quick-2", 4)
	if _, err := st.UpdateRecord(ctx, "acme", "quick-2", func(r *api.Record) { r.CancelRequested = true }); err != nil {
		t.Fatal(err)
	}
	runs.Store(0)
	if _, err := x.Process(ctx, inv); !isCancelled(err) || runs.Load() != 0 {
		t.Fatalf("cancelled before the run: %v, tool ran %d times; want cancelled, no run", err, runs.Load())
	}

	// A redelivery of a call that ended takes its recorded ending.
	inv, _ = call("quick", "quick-3", 5)
	if _, _, err := st.SetStatus(ctx, api.Record{InvocationID: "quick-3", Tenant: "acme", Status: api.StatusSuccess, Seq: 5,
		Response: &api.Response{InvocationID: "quick-3", Status: api.StatusSuccess, Result: json.RawMessage(`{"ended":true}`)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Process(ctx, inv); err != nil || runs.Load() != 0 || string(inv.Result) != `{"ended":true}` {
		t.Fatalf("ended before the redelivery: %v, ran %d times, result %s; want the recorded ending, no run", err, runs.Load(), inv.Result)
	}
}

func isCancelled(err error) bool { return errors.Is(err, &api.Error{Code: api.Cancelled}) }
