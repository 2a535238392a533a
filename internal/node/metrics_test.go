package node_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// TestMetrics: finished invocations are counted by status and E-code, so an
// error rate can be computed; durations have buckets up to minutes; the
// build is described by toolgate_build_info; and every series passes
// Prometheus' lint.
func TestMetrics(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{Stages: allBut(subjects.Audit)})
	reg := prometheus.NewPedanticRegistry()
	m := runner.NewMetrics(reg)
	ctx, cancel := context.WithCancel(context.Background())
	n, err := node.Open(ctx, e.url, "test-audit-metrics", e.topo, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	st, err := n.NewStage(ctx, subjects.Audit, node.StageConfig{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = n.Runner(subjects.Audit, st, 1, m).Run(ctx) }()
	t.Cleanup(func() { cancel(); n.Close(); <-done })

	if resp := e.invoke(request("met", "echo", `{"message":"hi"}`)); resp.Status != api.StatusSuccess {
		t.Fatalf("echo: %+v", resp)
	}
	if resp := e.invoke(request("met", "no.such.tool", `{}`)); resp.Error == nil || resp.Error.ECode != api.EToolNotFound {
		t.Fatalf("unknown tool: %+v", resp)
	}
	want := `
# HELP toolgate_invocations_finished_total Invocations finalised by audit, by status and error E-code (empty on success); at least once.
# TYPE toolgate_invocations_finished_total counter
toolgate_invocations_finished_total{error_code="",status="success"} 1
toolgate_invocations_finished_total{error_code="E3001",status="error"} 1
`
	eventually(t, 10*time.Second, "both invocations to be counted", func() bool {
		return testutil.GatherAndCompare(reg, strings.NewReader(want), "toolgate_invocations_finished_total") == nil
	})
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "toolgate_invocations_finished_total"); err != nil {
		t.Fatal(err)
	}
	if got := testutil.CollectAndCount(reg, "toolgate_invocation_duration_seconds"); got != 2 {
		t.Fatalf("%d invocation duration series, want 2 (success, error)", got)
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buildInfo, longBucket bool
	for _, mf := range mfs {
		switch mf.GetName() {
		case "toolgate_build_info":
			labels := map[string]string{}
			for _, l := range mf.GetMetric()[0].GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			buildInfo = mf.GetMetric()[0].GetGauge().GetValue() == 1 && labels["version"] != "" && strings.HasPrefix(labels["goversion"], "go")
		case "toolgate_stage_duration_seconds":
			for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
				longBucket = longBucket || b.GetUpperBound() >= 300
			}
		}
	}
	if !buildInfo {
		t.Error("toolgate_build_info is missing or lacks version and goversion")
	}
	if !longBucket {
		t.Error("stage durations have no bucket of five minutes or more")
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}
