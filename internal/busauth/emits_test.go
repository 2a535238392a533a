package busauth

import (
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// TestMayEmit: a role's key vouches for the events its role emits, with
// the type its subject names and the source it names, and nothing else
// on the same subjects.
func TestMayEmit(t *testing.T) {
	invoked := subjects.AuditEvent("acme", "tool.invoked")
	poison := subjects.AuditEvent("acme", "pipeline.poison")
	exec := "urn:toolgate:execute"
	cases := []struct {
		name                 string
		role                 Role
		subject, typ, source string
		tenant               string
		ok                   bool
	}{
		{"execute's tool.invoked", RoleExecute, invoked, api.TypeInvoked, exec, "acme", true},
		{"execute's checkpoint", RoleExecute, subjects.AuditEvent("acme", "tool.checkpoint.created"), api.TypeCheckpointCreated, exec, "acme", true},
		{"execute's breaker", RoleExecute, subjects.AuditEvent(subjects.SystemTenant, "circuit.opened"), api.TypeCircuitOpened, "urn:toolgate:breaker", "", true},
		{"execute's poison", RoleExecute, poison, api.TypePoison, exec, "acme", true},
		{"execute's state.refused", RoleExecute, subjects.AuditEvent(subjects.SystemTenant, "state.refused"), api.TypeStateRefused, exec, "", true},
		{"an approval on tool.invoked", RoleExecute, invoked, api.TypeApprovalGranted, "urn:toolgate:authorize", "acme", false},
		{"a success on tool.invoked", RoleExecute, invoked, api.TypeSucceeded, exec, "acme", false},
		{"a policy push on tool.invoked", RoleExecute, invoked, api.TypePolicyPushed, "urn:toolgate:control", "acme", false},
		{"tool.invoked from verify's source", RoleExecute, invoked, api.TypeInvoked, "urn:toolgate:verify", "acme", false},
		{"tool.invoked of another tenant", RoleExecute, invoked, api.TypeInvoked, exec, "other", false},
		{"tool.invoked without its prefix", RoleExecute, invoked, "tool.invoked", exec, "acme", false},
		{"a wildcard type", RoleExecute, subjects.AuditEvent("acme", "tool.checkpoint.>"), "ai.agent.tool.checkpoint.>", exec, "acme", false},
		{"a circuit event from execute's source", RoleExecute, subjects.AuditEvent(subjects.SystemTenant, "circuit.opened"), api.TypeCircuitOpened, exec, "", false},
		{"verify's poison", RoleVerify, poison, api.TypePoison, "urn:toolgate:verify", "acme", true},
		{"tool.invoked as verify's poison", RoleVerify, poison, api.TypeInvoked, exec, "acme", false},
		{"tool.invoked from verify", RoleVerify, invoked, api.TypeInvoked, exec, "acme", false},
		{"validate's pending answer", RoleValidate, subjects.Result("acme", "did=3Aagent=3Aacme", "x"), api.TypeAccepted, "urn:toolgate:validate", "acme", true},
		{"a result from validate", RoleValidate, subjects.Result("acme", "did=3Aagent=3Aacme", "x"), api.TypeResult, "urn:toolgate:audit", "acme", false},
		{"authorize's approval request", RoleAuthorize, subjects.AuditEvent("acme", "tool.approval.requested"), api.TypeApprovalRequested,
			"urn:toolgate:authorize", "acme", true},
		{"control's approval decision", RoleControl, subjects.AuditEvent("acme", "tool.approval.denied"), api.TypeApprovalDenied,
			"urn:toolgate:authorize", "acme", true},
		{"control's approval request", RoleControl, subjects.AuditEvent("acme", "tool.approval.requested"), api.TypeApprovalRequested,
			"urn:toolgate:authorize", "acme", false},
		{"control's policy push", RoleControl, subjects.AuditEvent(subjects.SystemTenant, "admin.policy.pushed"), api.TypePolicyPushed,
			"urn:toolgate:control", "", true},
		{"control's bus refusal", RoleControl, subjects.AuditEvent(subjects.SystemTenant, "bus.refused"), api.TypeBusRefused,
			"urn:toolgate:busauth", "", true},
		{"control's circuit event", RoleControl, subjects.AuditEvent(subjects.SystemTenant, "circuit.opened"), api.TypeCircuitOpened,
			"urn:toolgate:breaker", "", false},
		{"audit emits nothing on the relay", RoleAudit, invoked, api.TypeInvoked, "urn:toolgate:audit", "acme", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			why := MayEmit(tc.role, tc.subject, tc.typ, tc.source, tc.tenant)
			if tc.ok != (why == "") {
				t.Fatalf("MayEmit(%s, %s, %s, %s, %q) = %q, want ok=%v", tc.role, tc.subject, tc.typ, tc.source, tc.tenant, why, tc.ok)
			}
		})
	}
}

// Every relay subject a role may publish on is one of its Emissions, and
// each Emission names at least one type and one source.
func TestEmissionsComplete(t *testing.T) {
	for role, r := range Rights {
		for _, e := range r.Emits {
			if len(e.Types) == 0 || len(e.Sources) == 0 {
				t.Errorf("%s emits %s with no type or no source", role, e.Subject)
			}
			if !MayPublish(role, subjects.Relay(e.Subject)) {
				t.Errorf("%s may not publish the relay of %s, which it emits", role, e.Subject)
			}
		}
	}
}
