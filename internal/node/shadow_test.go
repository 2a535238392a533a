package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// switchOff is a candidate policy: the shipped one, with test.boom switched
// off.
const switchOff = `package toolgate.authz

deny contains {"msg": "test.boom is switched off", "code": "E3209"} if input.tool.id == "test.boom"
`

// TestShadowPolicy: a candidate pushed as a shadow is evaluated on every
// call beside the live policy and enforced on none; each call on which it
// disagrees is audited with both decisions and counted, the report sums
// them by tool, tenant and rule; promoted, it rules; dropped, it is no
// longer evaluated.
func TestShadowPolicy(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	e.startPipeline(node.Config{MetricsAddr: metricsAddr})
	const tenant = "shadow"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	modules := map[string]string{"authz.rego": policy.DefaultModule(), "candidate.rego": switchOff}
	if _, err := e.client.PushShadowPolicy(ctx, modules, nil, "carol"); err != nil {
		t.Fatal(err)
	}
	diverged := subjects.AuditEvent(tenant, "policy.shadow.diverged")
	var boom api.Response
	eventually(t, 15*time.Second, "authorize to evaluate the candidate", func() bool {
		boom = e.invoke(request(tenant, "test.boom", `{}`))
		return e.count(subjects.StreamAudit, diverged) > 0
	})
	// Enforced: the live policy only; the tool ran (and panicked).
	if boom.Error == nil || boom.Error.ECode != api.EToolPanicked {
		t.Fatalf("with the candidate in shadow: %+v, want the live policy's outcome (the tool ran: %s)", boom, api.EToolPanicked)
	}
	ev := e.read(subjects.StreamAudit, diverged, 1, 10*time.Second)[0]
	var got struct {
		Type string               `json:"type"`
		Data api.ShadowDivergence `json:"data"`
	}
	if err := json.Unmarshal(ev.Data(), &got); err != nil {
		t.Fatal(err)
	}
	d := got.Data
	if got.Type != api.TypeShadowDiverged || d.ToolID != "test.boom" || d.TenantID != tenant || !d.Live.Allow || d.Candidate.Allow ||
		d.Candidate.Code != api.EPolicyDenied || d.Rule != "test.boom is switched off" || d.CandidateRevision == 0 {
		t.Fatalf("divergence: %s", ev.Data())
	}
	// Agreement is not recorded.
	before := e.count(subjects.StreamAudit, diverged)
	if r := e.invoke(request(tenant, "echo", `{"message":"agreed"}`)); r.Status != api.StatusSuccess {
		t.Fatalf("echo: %+v", r)
	}
	if r := e.invoke(request(tenant, "test.boom", `{}`)); r.Error == nil || r.Error.ECode != api.EToolPanicked {
		t.Fatalf("boom: %+v", r)
	}
	if n := e.count(subjects.StreamAudit, diverged); n != before+1 {
		t.Fatalf("%d divergences after one agreeing and one disagreeing call, want %d", n, before+1)
	}
	rep, err := e.client.ShadowReport(ctx, api.ShadowReportRequest{})
	if err != nil || rep.Candidate == nil || rep.Diverged != before+1 || rep.NewlyDenied != before+1 ||
		len(rep.ByTool) != 1 || rep.ByTool[0].Key != "test.boom" || rep.ByTenant[0].Key != tenant || rep.ByRule[0].Key != "test.boom is switched off" {
		t.Fatalf("report: %+v %v", rep, err)
	}
	// Counted in Prometheus.
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := fmt.Sprintf(`toolgate_policy_shadow_diverged_total{candidate="deny",tenant="%s",tool="test.boom"} %d`, tenant, before+1); !strings.Contains(string(body), want) {
		t.Fatalf("metrics lack %q", want)
	}

	// Promoted, it rules, and is no longer a candidate.
	if _, err := e.client.PromoteShadowPolicy(ctx, "carol"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "the promoted policy to rule", func() bool {
		r := e.invoke(request(tenant, "test.boom", `{}`))
		return r.Error != nil && r.Error.ECode == api.EPolicyDenied && strings.Contains(r.Error.Message, "switched off")
	})
	if cand, err := e.client.ShadowPolicy(ctx); err != nil || cand.Pushed {
		t.Fatalf("after promote: candidate %+v %v", cand, err)
	}
	live, err := e.client.Policy(ctx)
	if err != nil || !live.Pushed || live.Modules["candidate.rego"] != switchOff {
		t.Fatalf("live policy after promote: %+v %v", live, err)
	}
	for _, typ := range []string{"admin.policy.shadow.pushed", "admin.policy.shadow.promoted"} {
		if e.count(subjects.StreamAudit, subjects.AuditEvent(subjects.SystemTenant, typ)) != 1 {
			t.Fatalf("no %s audit event", typ)
		}
	}

	// A candidate dropped is evaluated no more: the shipped policy as a
	// candidate disagrees on test.boom until it is dropped.
	if _, err := e.client.PushShadowPolicy(ctx, map[string]string{"authz.rego": policy.DefaultModule()}, nil, "carol"); err != nil {
		t.Fatal(err)
	}
	mark := e.count(subjects.StreamAudit, diverged)
	eventually(t, 15*time.Second, "the new candidate to be evaluated", func() bool {
		e.invoke(request(tenant, "test.boom", `{}`))
		return e.count(subjects.StreamAudit, diverged) > mark
	})
	if err := e.client.DropShadowPolicy(ctx, "carol"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the watch delivers the drop
	mark = e.count(subjects.StreamAudit, diverged)
	for range 3 {
		e.invoke(request(tenant, "test.boom", `{}`))
	}
	if n := e.count(subjects.StreamAudit, diverged); n != mark {
		t.Fatalf("%d divergences after the drop", n-mark)
	}
}

// TestPolicyReplay: with recording on, authorize audits every call's
// policy input, parameters redacted, and its decision; a candidate replayed
// against them names exactly the calls it would decide otherwise, before
// anything is pushed.
func TestPolicyReplay(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{Stage: node.StageConfig{RecordDecisions: true}})
	const tenant = "replay"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	since := time.Now().Add(-time.Second)
	var booms []string
	for i := range 3 {
		if r := e.invoke(request(tenant, "echo", fmt.Sprintf(`{"message":"hi %d"}`, i))); r.Status != api.StatusSuccess {
			t.Fatalf("echo: %+v", r)
		}
		r := e.invoke(request(tenant, "test.boom", `{"password":"hunter2"}`))
		booms = append(booms, r.InvocationID)
	}
	recorded := subjects.AuditEvent(tenant, "policy.decision.recorded")
	if n := e.count(subjects.StreamAudit, recorded); n != 6 {
		t.Fatalf("%d decisions recorded, want 6", n)
	}
	for _, m := range e.read(subjects.StreamAudit, recorded, 6, 10*time.Second) {
		if strings.Contains(string(m.Data()), "hunter2") {
			t.Fatalf("a recorded input holds the password: %s", m.Data())
		}
	}
	cand, err := policy.New(ctx, map[string]string{"authz.rego": policy.DefaultModule(), "candidate.rego": switchOff}, nil)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := e.client.RecordedDecisions(ctx, since)
	if err != nil {
		t.Fatal(err)
	}
	res := policy.Replay(ctx, cand, recs)
	var changed []string
	for _, c := range res.Changes {
		changed = append(changed, c.InvocationID)
		if !c.Live.Allow || c.Candidate.Allow || c.ToolID != "test.boom" || c.Candidate.Reasons[0] != "test.boom is switched off" {
			t.Fatalf("change %+v", c)
		}
	}
	if res.Recorded != 6 || res.Changed != 3 || res.NewlyDenied != 3 || strings.Join(changed, ",") != strings.Join(booms, ",") {
		t.Fatalf("replay: %+v, want the 3 boom calls %v", res, booms)
	}
	// The shipped policy itself changes nothing.
	if same := policy.Replay(ctx, mustDefault(t), recs); same.Recorded != 6 || same.Changed != 0 {
		t.Fatalf("replay of the live policy: %+v", same)
	}
}

func mustDefault(t *testing.T) *policy.Engine {
	e, err := policy.Default(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return e
}
