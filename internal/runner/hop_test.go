package runner

import (
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// TestHopIDs: a redelivery hands on under the same message id, so the
// successor is stored once; two invocations are never taken for one, even
// under the same ingest sequence (a clustered stream that handed a sequence
// out twice after losing a write), or JetStream would drop the second
// invocation's hand-off as a duplicate.
func TestHopIDs(t *testing.T) {
	a := &envelope.Invocation{ID: "inv-000045", Tenant: "acme", Event: envelope.Event{Seq: 45}}
	again := *a
	if HopID(a, subjects.Authorize) != HopID(&again, subjects.Authorize) {
		t.Fatal("a redelivery hands on under another message id")
	}
	if HopID(a, subjects.Authorize) == HopID(a, subjects.Route) {
		t.Fatal("two hops share a message id")
	}
	for _, b := range []*envelope.Invocation{
		{ID: "inv-000012", Tenant: "acme", Event: envelope.Event{Seq: 45}},
		{ID: "inv-000045", Tenant: "other", Event: envelope.Event{Seq: 45}},
	} {
		if HopID(a, subjects.Authorize) == HopID(b, subjects.Authorize) {
			t.Errorf("%s/%s and %s/%s share hop id %s", a.Tenant, a.ID, b.Tenant, b.ID, HopID(a, subjects.Authorize))
		}
		ea, _ := stages.AuditEvent(subjects.Audit, a, api.TypeSucceeded, nil)
		eb, _ := stages.AuditEvent(subjects.Audit, b, api.TypeSucceeded, nil)
		if ea.MsgID == eb.MsgID {
			t.Errorf("%s/%s and %s/%s share audit message id %s", a.Tenant, a.ID, b.Tenant, b.ID, ea.MsgID)
		}
	}
}
