package pipeline_test

import (
	"context"
	"testing"
	"time"

	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/stages/invocation"
	"github.com/toolgate/toolgate/stages/pipeline"
	"github.com/toolgate/toolgate/stages/toolerr"
	"github.com/toolgate/toolgate/subjects"
)

// TestRateLimitAcrossWorkers: three route processes share one tool's bucket
// of ten calls (refilling one an hour): exactly ten of forty calls run, the
// rest end rate_limit_exceeded, retryable, with a retry-after and a
// rate_limited audit event.
func TestRateLimitAcrossWorkers(t *testing.T) {
	e := newEnv(t, stages.TopologyOptions{})
	n := e.startPipeline(pipeline.Config{Stages: allBut(subjects.Route)})
	for range 3 {
		e.runStage(subjects.Route, nil, 2, 0)
	}
	registerTools(t, n, `{"id":"test.limited","name":"limited","version":"1.0.0","description":"ten an hour","kind":"builtin",
	  "builtin":{"function":"noop"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
	  "rate_limit":{"requests":10,"per_seconds":3600}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const tenant, total = "rl", 40
	ids := make([]string, total)
	for i := range ids {
		id, err := e.client.Invoke(ctx, request(tenant, "test.limited", `{}`), clientOpts(""))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	ok, limited := 0, 0
	for _, id := range ids {
		resp, err := e.client.Wait(ctx, tenant, id)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case resp.Status == invocation.StatusSuccess:
			ok++
		case resp.Error != nil && resp.Error.Code == toolerr.RateLimitExceeded && resp.Error.ECode == toolerr.ERateLimited:
			if !resp.Error.Retryable || resp.Error.Details["retry_after_ms"] == nil {
				t.Fatalf("rate limit error without retry advice: %s", mustJSON(t, resp.Error))
			}
			limited++
		default:
			t.Fatalf("unexpected %+v", resp)
		}
	}
	if ok != 10 || limited != total-10 {
		t.Fatalf("%d ran and %d were limited; want 10 and %d", ok, limited, total-10)
	}
	if got := e.count(subjects.StreamAudit, subjects.AuditEvent(tenant, invocation.SubjectSuffix(invocation.TypeRateLimited))); got != total-10 {
		t.Fatalf("%d rate_limited audit events, want %d", got, total-10)
	}
	// Another tenant has its own bucket.
	if resp := e.invoke(request("rl2", "test.limited", `{}`)); resp.Status != invocation.StatusSuccess {
		t.Fatalf("other tenant: %+v", resp)
	}
}
