package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
)

// TestNoisyNeighbour: tenant A queues a backlog of slow calls that would
// keep every execute worker busy for seconds; tenant B's no-op, published
// behind them, completes within a bound far below A's backlog time,
// because A may hold only its quota of workers. Every call of A still
// succeeds: the quota delays calls, never fails them.
func TestNoisyNeighbour(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	const workers, calls, sleepMS = 4, 30, 600
	e.startPipeline(node.Config{Workers: workers})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	backlog := time.Duration(calls*sleepMS/workers) * time.Millisecond // with every worker on A

	// Warm up B's path, so that the bound measures queueing, not a first call.
	if resp := e.invoke(request("victim", "noop", `{}`)); resp.Status != api.StatusSuccess {
		t.Fatalf("warm-up: %s", mustJSON(t, resp))
	}
	var ids []string
	for range calls {
		id, err := e.client.Invoke(ctx, request("noisy", "sleep", `{"ms":600}`), clientOpts(""))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	start := time.Now()
	id, err := e.client.Invoke(ctx, request("victim", "noop", `{}`), clientOpts(""))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := e.client.Wait(ctx, "victim", id)
	took := time.Since(start)
	if err != nil || resp.Status != api.StatusSuccess {
		t.Fatalf("victim: %s, %v", mustJSON(t, resp), err)
	}
	t.Logf("victim's no-op took %s behind a backlog of %s", took, backlog)
	if bound := backlog / 4; took > bound {
		t.Errorf("victim's no-op took %s, want under %s (the noisy backlog is %s)", took, bound, backlog)
	}
	for _, id := range ids {
		resp, err := e.client.Wait(ctx, "noisy", id)
		if err != nil || resp.Status != api.StatusSuccess {
			t.Fatalf("noisy call %s: %s, %v", id, mustJSON(t, resp), err)
		}
	}
}

// TestTenantAloneUsesAllThenShares: a tenant alone runs as many calls as
// execute's capacity (the quota holds none back while nobody else runs
// calls); another tenant's call, arriving while every one of them still
// runs, starts at once in the headroom instead of waiting for one to end.
func TestTenantAloneUsesAllThenShares(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	const workers = 8
	e.startPipeline(node.Config{Workers: workers})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var ids []string
	invoke := func(tenant string) {
		id, err := e.client.Invoke(ctx, request(tenant, "test.hold", fmt.Sprintf(`{"tenant":%q}`, tenant)), clientOpts(""))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, tenant, id)
	}
	for range workers {
		invoke("busy")
	}
	busy, other := e.holdingOf(`{"tenant":"busy"}`), e.holdingOf(`{"tenant":"other"}`)
	eventually(t, 30*time.Second, "the lone tenant to run as many calls as there are workers", func() bool {
		return busy.Load() == workers
	})
	invoke("other")
	eventually(t, 30*time.Second, "the other tenant's call to start while the lone tenant's all run", func() bool {
		return other.Load() == 1
	})
	if got := busy.Load(); got != workers {
		t.Fatalf("the first tenant runs %d calls, want %d", got, workers)
	}
	e.release()
	for i := 0; i < len(ids); i += 2 {
		resp, err := e.client.Wait(ctx, ids[i], ids[i+1])
		if err != nil || resp.Status != api.StatusSuccess {
			t.Fatalf("call %s of %s: %s, %v", ids[i+1], ids[i], mustJSON(t, resp), err)
		}
	}
}
