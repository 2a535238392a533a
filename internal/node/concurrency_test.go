package node_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// waitingCalls is the series of the default-concurrency goal: this many
// concurrent calls of a tool that waits, from one tenant.
const waitingCalls = 200

// TestDefaultConcurrency: with execute's default setting, 200 calls of one
// tenant to a tool that waits all run at once: the tenant is alone, so its
// quota does not hold any back.
func TestDefaultConcurrency(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{Workers: node.DefaultWorkers})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := make([]string, waitingCalls)
	for i := range ids {
		id, err := e.client.Invoke(ctx, request("busy", "test.hold", `{}`), clientOpts(""))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	eventually(t, 45*time.Second, fmt.Sprintf("%d calls running at once", waitingCalls), func() bool {
		return e.holding.Load() == waitingCalls
	})
	e.release()
	for _, id := range ids {
		resp, err := e.client.Wait(ctx, "busy", id)
		if err != nil || resp.Status != api.StatusSuccess {
			t.Fatalf("call %s: %s, %v", id, mustJSON(t, resp), err)
		}
	}
}

// BenchmarkWaitingCalls: 200 concurrent calls of a tool that sleeps 1 s,
// from one tenant, with execute's default concurrency. The goal: all end
// within 2 s of the first being sent (s/batch).
func BenchmarkWaitingCalls(b *testing.B) {
	e := newEnv(b, topology.TopologyOptions{})
	e.startPipeline(node.Config{Workers: node.DefaultWorkers})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if resp := e.invoke(request("busy", "sleep", `{"ms":1}`)); resp.Status != api.StatusSuccess {
		b.Fatalf("warm-up: %v", resp.Error)
	}
	var worst time.Duration
	for b.Loop() {
		start := time.Now()
		ids := make([]string, waitingCalls)
		for i := range ids {
			id, err := e.client.Invoke(ctx, request("busy", "sleep", `{"ms":1000}`), clientOpts(""))
			if err != nil {
				b.Fatal(err)
			}
			ids[i] = id
		}
		for _, id := range ids {
			resp, err := e.client.Wait(ctx, "busy", id)
			if err != nil || resp.Status != api.StatusSuccess {
				b.Fatalf("call %s: %v, %v", id, resp.Error, err)
			}
		}
		worst = max(worst, time.Since(start))
	}
	b.ReportMetric(worst.Seconds(), "s/batch")
}

// BenchmarkNewcomer: one tenant fills execute's default capacity with calls
// of a tool that sleeps 3 s; another tenant's no-ops, sent one after
// another meanwhile, start at once in the headroom. The goal: each within
// 100 ms (victim-max-ms), however long the running calls take.
func BenchmarkNewcomer(b *testing.B) {
	e := newEnv(b, topology.TopologyOptions{})
	e.startPipeline(node.Config{Workers: node.DefaultWorkers})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	victim := func() time.Duration {
		start := time.Now()
		if resp := e.invoke(request("victim", "noop", `{}`)); resp.Status != api.StatusSuccess {
			b.Fatalf("victim: %v", resp.Error)
		}
		return time.Since(start)
	}
	victim() // warm up its path
	var took []time.Duration
	for b.Loop() {
		ids := make([]string, node.DefaultWorkers)
		for i := range ids {
			id, err := e.client.Invoke(ctx, request("busy", "sleep", `{"ms":3000}`), clientOpts(""))
			if err != nil {
				b.Fatal(err)
			}
			ids[i] = id
		}
		for {
			info, err := e.consumerInfo(subjects.Execute)
			if err != nil {
				b.Fatal(err)
			}
			if info.NumAckPending >= node.DefaultWorkers {
				break // every slot of capacity holds a sleeping call
			}
			runtime.Gosched()
		}
		for range 20 {
			took = append(took, victim())
		}
		for _, id := range ids {
			if resp, err := e.client.Wait(ctx, "busy", id); err != nil || resp.Status != api.StatusSuccess {
				b.Fatalf("busy call %s: %v, %v", id, resp.Error, err)
			}
		}
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "victim-p50-ms")
	b.ReportMetric(float64(took[len(took)-1].Microseconds())/1000, "victim-max-ms")
}
