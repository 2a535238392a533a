package audit

import (
	"strings"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/hooks"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// TestApply: what each decision makes of the outcome; the table is the
// one docs/hooks.md gives.
func TestApply(t *testing.T) {
	failed := func() *envelope.Invocation {
		inv := &envelope.Invocation{ID: "i", Tenant: "t", Request: &api.Request{ToolID: "x"}}
		inv.Fail(subjects.Execute, api.NewError(api.ExternalAPIError, "E3304", "upstream 503").AsRetryable())
		return inv
	}
	cases := []struct {
		name   string
		inv    *envelope.Invocation
		d      kvstore.HookDecision
		status api.Status
		ecode  string
		check  func(t *testing.T, inv *envelope.Invocation)
	}{
		{"skip", failed(), kvstore.HookDecision{Hook: "h", Action: hooks.ActionSkip}, api.StatusCancelled, api.EHookSkipped,
			func(t *testing.T, inv *envelope.Invocation) {
				if c, _ := inv.Error.Details["cause"].(*api.Error); c == nil || c.ECode != "E3304" {
					t.Fatalf("cause %v", inv.Error.Details)
				}
			}},
		{"fail", failed(), kvstore.HookDecision{Hook: "h", Action: hooks.ActionFail}, api.StatusError, "E3304",
			func(t *testing.T, inv *envelope.Invocation) {
				if inv.Error.Retryable {
					t.Fatal("still retryable")
				}
			}},
		{"continue", failed(), kvstore.HookDecision{Hook: "h", Action: hooks.ActionContinue}, api.StatusError, "E3304",
			func(t *testing.T, inv *envelope.Invocation) {
				if !inv.Error.Retryable || inv.Metadata.Hook.Action != "continue" {
					t.Fatalf("%+v", inv.Metadata.Hook)
				}
			}},
		{"limit", failed(), kvstore.HookDecision{Hook: "h", Action: hooks.ActionRetry, Limit: true}, api.StatusError, api.EHookLimit, nil},
		{"handed on", failed(), kvstore.HookDecision{Hook: "h", Action: hooks.ActionRetry, Child: &kvstore.HookChild{ID: "i.hook1"}},
			api.StatusError, "E3304", func(t *testing.T, inv *envelope.Invocation) {
				if inv.Metadata.Hook.HandedTo != "i.hook1" {
					t.Fatalf("%+v", inv.Metadata.Hook)
				}
			}},
		{"abort", failed(), kvstore.HookDecision{Hook: "h", Action: hooks.ActionAbort, Session: "root"}, api.StatusError, "E3304",
			func(t *testing.T, inv *envelope.Invocation) {
				if !inv.Metadata.Hook.SessionAborted {
					t.Fatal("session not reported aborted")
				}
			}},
		{"skip on success", func() *envelope.Invocation {
			inv := &envelope.Invocation{ID: "i", Tenant: "t", Request: &api.Request{ToolID: "x"}}
			inv.Succeed(subjects.Verify, []byte(`{}`))
			return inv
		}(), kvstore.HookDecision{Hook: "h", Action: hooks.ActionSkip}, api.StatusSuccess, "", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			apply(c.inv, &c.d)
			if c.inv.Status != c.status || (c.ecode != "" && (c.inv.Error == nil || c.inv.Error.ECode != c.ecode)) {
				t.Fatalf("got %s %v, want %s %s", c.inv.Status, c.inv.Error, c.status, c.ecode)
			}
			if c.inv.Metadata.Hook == nil || c.inv.Metadata.Hook.Hook != "h" {
				t.Fatalf("no hook outcome: %+v", c.inv.Metadata.Hook)
			}
			if c.check != nil {
				c.check(t, c.inv)
			}
		})
	}
}

func TestChildID(t *testing.T) {
	if got := childID("abc", 2); got != "abc.hook2" {
		t.Fatal(got)
	}
	long := strings.Repeat("x", subjects.MaxIDBytes)
	if got := childID(long, 1); len(got) > subjects.MaxIDBytes || got == childID(long+"y", 1) {
		t.Fatalf("child id %q", got)
	}
}
