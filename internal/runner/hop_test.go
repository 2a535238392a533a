package runner

import (
	"strings"
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

// TestHopIDValue: a hand-off's id, made with its header value in one
// allocation, is the id HopID and EndingID make, tagged or not, and one
// longer than the room kept for it too.
func TestHopIDValue(t *testing.T) {
	inv := &envelope.Invocation{ID: "inv-1", Tenant: "acme", Event: envelope.Event{Seq: 1<<64 - 1}}
	for _, c := range []struct{ next, tag string }{
		{subjects.Route, ""}, {subjects.Audit, "AAECAwQFBgcICQoL"},
		{strings.Repeat("s", 60), strings.Repeat("t", 60)},
	} {
		want := EndingID(HopID(inv, c.next), c.tag)
		if got := hopIDValue(inv, c.next, c.tag); len(got) != 1 || got[0] != want {
			t.Errorf("hopIDValue(%q, %q) = %q, want %q", c.next, c.tag, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { hopIDValue(inv, subjects.Audit, "AAECAwQFBgcICQoL") }); n != 1 {
		t.Errorf("%v allocations for a tagged id, want 1", n)
	}
}
