package node_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// TestAuditChainFromPublishAcks: audit's checkpoints cover the events its
// own connection published from their publish acknowledgements, and read
// back only the others (here the tool.invoked of a tool still running
// after 100 ms, which execute announces itself on a bus without
// authentication; a quicker tool's rides with its ending, which audit
// publishes); the trail verifies intact, and the metric says where the
// leaves came from.
func TestAuditChainFromPublishAcks(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{Stages: allBut(subjects.Audit)})
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	reg := prometheus.NewPedanticRegistry()
	metrics := node.NewAuditChainMetrics(reg)
	ctx, cancel := context.WithCancel(context.Background())
	n, err := node.Open(ctx, e.url, "test-audit-chain", e.topo, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	st, err := n.NewStage(ctx, subjects.Audit, node.StageConfig{AuditChainKey: key, AuditCheckpointEvery: 10,
		AuditCheckpointInterval: 200 * time.Millisecond, AuditChainMetrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = n.Runner(subjects.Audit, st, 2, nil).Run(ctx) }()
	t.Cleanup(func() { cancel(); n.StopStages(); n.Close(); <-done })
	// The checkpointer takes leaves once it runs, and not of a stream made
	// a moment before (it may be one deleted and made again).
	time.Sleep(1500 * time.Millisecond)

	for i := range 12 {
		if r := e.invoke(request("chain", "echo", fmt.Sprintf(`{"message":"m%d"}`, i))); r.Status != api.StatusSuccess {
			t.Fatalf("echo: %+v", r)
		}
	}
	for range 3 {
		if r := e.invoke(request("chain", "sleep", `{"ms":300}`)); r.Status != api.StatusSuccess {
			t.Fatalf("sleep: %+v", r)
		}
	}
	js, _ := jetstream.New(e.connect())
	audit, err := js.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	last := audit.CachedInfo().State.LastSeq
	eventually(t, 20*time.Second, fmt.Sprintf("a checkpoint to cover AUDIT up to %d", last), func() bool {
		tail, err := auditchain.LastCheckpoint(ctx, js)
		return err == nil && tail.Checkpoint != nil && tail.Checkpoint.Last >= last
	})
	r, err := auditchain.Verify(ctx, auditchain.Bus{JS: js}, auditchain.Options{Key: pub, To: last})
	if err != nil || !r.Intact() || r.Events == 0 {
		t.Fatalf("verify: %+v %v", r, err)
	}
	acks, read := chainEvents(t, reg, "ack"), chainEvents(t, reg, "read")
	// Audit publishes both events of each echo and sleep's endings;
	// execute announced sleep's tool.invoked.
	if acks < 27 || read < 3 {
		t.Fatalf("%v events covered from acks, %v read back; want at least 27 and 3", acks, read)
	}
	t.Logf("%v events covered from acks, %v read back", acks, read)
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}

// chainEvents is toolgate_audit_chain_events_total{leaf}.
func chainEvents(t *testing.T, reg *prometheus.Registry, leaf string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "toolgate_audit_chain_events_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == leaf {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no toolgate_audit_chain_events_total{leaf=%q}", leaf)
	return 0
}
