package control

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// TestRolePeopleSignAdmin: an administrative change signed by an admin is
// recorded by name; by the operator, flagged break-glass; by an approver or
// an auditor, refused (E3245) with nothing changed and the refusal audited.
func TestRolePeopleSignAdmin(t *testing.T) {
	subject := subjects.SvcTokensRevoke
	for _, tc := range []struct {
		who, ecode string
		breakGlass bool
	}{
		{"admin:bob", "", false},
		{"operator:local", "", true},
		{"approver:alice", api.ERoleNotPermitted, false},
		{"auditor:carol", api.ERoleNotPermitted, false},
	} {
		t.Run(tc.who, func(t *testing.T) {
			f := &fakeAdmin{}
			var audited []stages.Output
			h := adminHandlers(f, func(string, nats.Header, []byte) (string, error) { return tc.who, nil }, &audited)
			req := &subjectRequest{fakeRequest{data: []byte(adminRequests[subject])}, subject}
			h.adminEndpoints()[subject](req)
			if got := req.ecode(t); got != tc.ecode {
				t.Fatalf("E-code %q, want %q (%s)", got, tc.ecode, req.body)
			}
			if len(audited) != 1 {
				t.Fatalf("%d audit events, want 1", len(audited))
			}
			data := string(audited[0].Data)
			if tc.ecode != "" {
				if f.writes != 0 || audited[0].Subject != subjects.AuditEvent(subjects.SystemTenant, "admin.refused") ||
					!strings.Contains(data, `"by":"`+tc.who+`"`) || !strings.Contains(data, tc.ecode) {
					t.Fatalf("refused: %d writes, audited %s %s", f.writes, audited[0].Subject, data)
				}
				return
			}
			if f.writes != 1 || !strings.Contains(data, `"by":"`+tc.who+`"`) || strings.Contains(data, `"break_glass":true`) != tc.breakGlass {
				t.Fatalf("accepted: %d writes, audited %s, want break_glass %v", f.writes, data, tc.breakGlass)
			}
		})
	}
}
