package envelope

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/redact"
)

func auditedInvocation() *Invocation {
	return &Invocation{ID: "i-1", Tenant: "acme", Status: api.StatusRunning, Event: Event{Seq: 5},
		Request: &api.Request{ToolID: "echo", AgentContext: api.AgentContext{AgentDID: "did:agent:a", SessionID: "s1"},
			Parameters: json.RawMessage(`{"path":"/r/a.txt","db_password":"hunter2","note":"mail bob@example.com","n":4111111111111111}`)}}
}

// TestAuditRedactsOnceAndAsBefore: a second record of the same call reuses
// the parameters' redacted form, to the bytes Redact writes; parameters
// replaced are redacted again, and a decoded hop redacts for itself.
func TestAuditRedactsOnceAndAsBefore(t *testing.T) {
	inv := auditedInvocation()
	want := redact.Redact(inv.Request.Parameters)
	first, _ := json.Marshal(inv.Audit())
	inv.Status = api.StatusSuccess
	inv.EndedBy = "verify"
	if got := inv.Audit().Parameters; !bytes.Equal(got, want) {
		t.Fatalf("second record's parameters %s, want %s", got, want)
	}
	if strings.Contains(string(first), "hunter2") || strings.Contains(string(first), "bob@example.com") {
		t.Fatalf("a secret reached the record: %s", first)
	}
	fresh := testing.AllocsPerRun(20, func() { auditedInvocation().Audit() })
	again := testing.AllocsPerRun(20, func() { inv.Audit() })
	if again > fresh/2 {
		t.Errorf("a second record allocates %.0f, a first %.0f: the parameters were redacted again", again, fresh)
	}

	inv.Request.Parameters = json.RawMessage(`{"api_key":"sk-other","path":"/etc/passwd"}`)
	got := inv.Audit().Parameters
	if !bytes.Equal(got, redact.Redact(inv.Request.Parameters)) || strings.Contains(string(got), "sk-other") {
		t.Fatalf("replaced parameters recorded as %s", got)
	}

	b, _ := json.Marshal(inv)
	var hop Invocation
	if err := json.Unmarshal(b, &hop); err != nil {
		t.Fatal(err)
	}
	if hop.redacted.out != nil {
		t.Fatal("a decoded hop carries a redacted form it did not make")
	}
	if !bytes.Equal(hop.Audit().Parameters, got) {
		t.Fatalf("a decoded hop records %s, want %s", hop.Audit().Parameters, got)
	}
}

// BenchmarkAudit is a call's audit record: its first (the parameters
// redacted) and a later one in the same process (audit's terminal event
// after execute's tool.invoked, in serve).
func BenchmarkAudit(b *testing.B) {
	b.Run("first", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			auditedInvocation().Audit()
		}
	})
	b.Run("again", func(b *testing.B) {
		inv := auditedInvocation()
		inv.Audit()
		b.ReportAllocs()
		for b.Loop() {
			inv.Audit()
		}
	})
}
