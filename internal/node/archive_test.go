package node_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// TestAuditArchiveStoreDown: audit archives beside its checkpointer; with
// the S3 store unreachable each run fails, counts, records an
// audit.archive.failed event (E3970) and leaves AUDIT as it was.
func TestAuditArchiveStoreDown(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{Stages: allBut(subjects.Audit)})
	// A port nothing listens on: the store is down.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close()
	t.Setenv("AWS_ACCESS_KEY_ID", "k")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "s")
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	reg := prometheus.NewPedanticRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	n, err := node.Open(ctx, e.url, "test-audit-archive", e.topo, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	st, err := n.NewStage(ctx, subjects.Audit, node.StageConfig{AuditChainKey: key, AuditCheckpointEvery: 10,
		AuditCheckpointInterval: 200 * time.Millisecond, AuditArchive: "s3://cold/audit?endpoint=http://" + down,
		AuditArchiveEvery: 300 * time.Millisecond, AuditArchiveMetrics: node.NewAuditArchiveMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = n.Runner(subjects.Audit, st, 2, nil).Run(ctx) }()
	t.Cleanup(func() { cancel(); n.StopStages(); n.Close(); <-done })
	if r := e.invoke(request("archive", "echo", `{"message":"kept"}`)); r.Status != api.StatusSuccess {
		t.Fatalf("echo: %+v", r)
	}
	js, _ := jetstream.New(e.connect())
	var failed struct {
		Code    string `json:"code"`
		Archive string `json:"archive"`
		Attempt int    `json:"attempt"`
	}
	eventually(t, 30*time.Second, "an audit.archive.failed event", func() bool {
		audit, err := js.Stream(ctx, subjects.StreamAudit)
		if err != nil {
			return false
		}
		m, err := audit.GetLastMsgForSubject(ctx, subjects.AuditEvent(subjects.SystemTenant, "audit.archive.failed"))
		if err != nil {
			return false
		}
		var ev struct {
			Data json.RawMessage `json:"data"`
		}
		return json.Unmarshal(m.Data, &ev) == nil && json.Unmarshal(ev.Data, &failed) == nil
	})
	if failed.Code != api.EAuditArchiveFailed || failed.Archive != "s3://cold/audit/" || failed.Attempt < 1 {
		t.Fatalf("audit.archive.failed: %+v", failed)
	}
	if got := counterValue(t, reg, "toolgate_audit_archive_failures_total"); got < 1 {
		t.Fatalf("failures_total = %v", got)
	}
	// Nothing left AUDIT: the call's events are all there.
	audit, _ := js.Stream(ctx, subjects.StreamAudit)
	if _, err := audit.GetLastMsgForSubject(ctx, subjects.AuditEvent("archive", "tool.succeeded")); err != nil {
		t.Fatalf("the call's ending: %v", err)
	}
}

// counterValue is the value of the counter named name on reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}
