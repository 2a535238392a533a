package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// terminalAndDuplicates counts tenant's terminal and tool.duplicate audit
// events.
func (e *env) terminalAndDuplicates(tenant string) (terminal, duplicates int) {
	e.t.Helper()
	for _, ev := range e.auditOf(tenant, e.count(subjects.StreamAudit, subjects.AuditTenant(tenant))) {
		switch {
		case isTerminal(ev):
			terminal++
		case ev.Type() == api.TypeDuplicate:
			duplicates++
		}
	}
	return terminal, duplicates
}

// TestRepublishPastTheWindowEndsOnce: a client whose publish acknowledgement
// was lost publishes the same event again (same Nats-Msg-Id, same body)
// after the invoke stream's duplicate window. The copy is stored, and
// answered by the first result: one result, one terminal event, the status
// untouched, and the repeat audited as tool.duplicate.
func TestRepublishPastTheWindowEndsOnce(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})
	const tenant = "again"
	h := ceHeader("dup-1")
	h.Set(nats.MsgIdHdr, "dup-msg")
	body := echoBody(tenant, "once")
	first := e.publishRaw(subjects.Invoke(tenant), h, body)
	if first.Status != api.StatusSuccess {
		t.Fatalf("first: %+v", first)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eventually(t, 10*time.Second, "the re-publish to be stored past the duplicate window", func() bool {
		ack, err := e.js.PublishMsg(ctx, &nats.Msg{Subject: subjects.Invoke(tenant), Header: h, Data: body})
		return err == nil && !ack.Duplicate
	})
	eventually(t, 10*time.Second, "the repeat's audit event", func() bool {
		_, d := e.terminalAndDuplicates(tenant)
		return d == 1
	})
	if terminal, _ := e.terminalAndDuplicates(tenant); terminal != 1 {
		t.Fatalf("%d terminal events, want 1", terminal)
	}
	if n := e.count(subjects.StreamResults, subjects.ResultAnyAgent(tenant, "dup-1")); n != 1 {
		t.Fatalf("%d results, want the first one only", n)
	}
	rec, err := e.client.Status(ctx, tenant, "dup-1")
	if err != nil || rec.Status != api.StatusSuccess {
		t.Fatalf("status %+v (%v)", rec, err)
	}
}
