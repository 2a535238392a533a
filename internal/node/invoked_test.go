package node_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// TestInvokedWhileRunning: a watcher of audit.<tenant>.> sees tool.invoked
// while the tool still runs, and the trail holds it once.
func TestInvokedWhileRunning(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})
	watch, err := e.nc.SubscribeSync(subjects.AuditTenant("watch"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Within sleep's 10 s limit; the event must come well before the end.
	id, err := e.client.Invoke(ctx, request("watch", "sleep", `{"ms":9000}`), clientOpts(""))
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(6 * time.Second)
	for {
		m, err := watch.NextMsg(time.Until(until))
		if err != nil {
			t.Fatalf("no tool.invoked while sleep runs: %v", err)
		}
		var ev event.Event
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Type() == api.TypeInvoked {
			break
		}
		if ev.Type() != api.TypeApprovalRequested {
			t.Fatalf("%s arrived before tool.invoked", ev.Type())
		}
	}
	rec, err := e.client.Status(ctx, "watch", id)
	if err != nil || rec.Status != api.StatusRunning {
		t.Fatalf("status when tool.invoked arrived: %+v, %v", rec.Status, err)
	}
	// End the call early; the trail keeps one tool.invoked.
	if _, err := e.client.Cancel(ctx, "watch", id, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Wait(ctx, "watch", id); err != nil {
		t.Fatal(err)
	}
	if n := e.count(subjects.StreamAudit, subjects.AuditEvent("watch", envelope.SubjectSuffix(api.TypeInvoked))); n != 1 {
		t.Fatalf("%d tool.invoked events, want 1", n)
	}
}
