package runner

import (
	"errors"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/stages"
	"testing"
)

func TestSettle(t *testing.T) {
	denied := api.NewError(api.PermissionDenied, api.EPolicyDenied, "no")
	flaky := stages.Transient(errors.New("kv unavailable"), 0)
	cases := []struct {
		name       string
		stage      string
		terminal   bool // the stage ended the invocation itself
		parked     bool // the stage parked it for approval
		err        error
		delivered  int
		want       action
		wantNext   string
		wantStatus api.Status
		wantECode  string
	}{
		{"pass on", "validate", false, false, nil, 1, actForward, "authorize", api.StatusPending, ""},
		{"verify hands to audit", "verify", false, false, nil, 1, actForward, "audit", api.StatusPending, ""},
		{"stage ended it", "route", true, false, nil, 1, actForward, "audit", api.StatusSuccess, ""},
		{"coded error ends it", "authorize", false, false, denied, 1, actForward, "audit", api.StatusPermissionDenied, api.EPolicyDenied},
		{"plain error ends it as internal", "route", false, false, errors.New("bug"), 1, actForward, "audit", api.StatusError, api.EInternal},
		{"transient retried", "execute", false, false, flaky, 2, actRetry, "", api.StatusPending, ""},
		{"transient on last delivery ends it", "execute", false, false, flaky, 5, actForward, "audit", api.StatusError, api.EDeliveryExhausted},
		{"parked for approval", "authorize", false, true, nil, 1, actDone, "", api.StatusPendingApproval, ""},
		{"audit finishes", "audit", true, false, nil, 1, actDone, "", api.StatusSuccess, ""},
		{"audit retried", "audit", true, false, flaky, 1, actRetry, "", api.StatusSuccess, ""},
		{"audit exhausted terminates", "audit", true, false, flaky, 5, actTerm, "", api.StatusSuccess, ""},
		{"audit broken terminates", "audit", true, false, errors.New("bug"), 1, actTerm, "", api.StatusSuccess, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			inv := &envelope.Invocation{ID: "i", Status: api.StatusPending}
			if c.terminal {
				inv.Succeed(c.stage, []byte(`{}`))
			}
			if c.parked {
				inv.Status = api.StatusPendingApproval
			}
			s := settle(c.stage, c.stage == "audit", inv, c.err, c.delivered, 5)
			if s.act != c.want || s.next != c.wantNext {
				t.Fatalf("settle = %+v, want action %d next %q", s, c.want, c.wantNext)
			}
			if inv.Status != c.wantStatus {
				t.Fatalf("status %s, want %s", inv.Status, c.wantStatus)
			}
			if c.wantECode != "" && (inv.Error == nil || inv.Error.ECode != c.wantECode) {
				t.Fatalf("error %v, want %s", inv.Error, c.wantECode)
			}
			if s.act == actRetry && s.delay <= 0 {
				t.Fatal("retry without delay")
			}
		})
	}
}

func TestBackoffGrowsAndIsCapped(t *testing.T) {
	for n := 1; n < 40; n++ {
		if d := backoff(n); d <= 0 || d > 30_001_000_000 {
			t.Fatalf("backoff(%d) = %v", n, d)
		}
	}
}
