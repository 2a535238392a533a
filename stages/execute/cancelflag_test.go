package execute

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages/execute/builtin"
)

// A cancel flag stops a call only with the control service's signature for
// that very call and asker, and an agent's only on that agent's call; any
// other is ignored and reported.
func TestCancelFlagNeedsControlSignature(t *testing.T) {
	reg := tools.NewRegistry()
	reg.Put(&tools.Manifest{ID: "echo", Version: "1.0.0", Kind: "builtin", Builtin: &tools.BuiltinConfig{Function: "echo"}})
	builtins := builtin.Set{"echo": func(_ context.Context, p json.RawMessage) (json.RawMessage, error) { return p, nil }}
	signed := func(tenant, id, by, sig string) bool { return sig == "control:"+tenant+"/"+id+"/"+by }
	cases := []struct {
		name, sig, by string
		wantCancel    bool
		wantRefused   string
	}{
		{name: "signed by control for this call", sig: "control:acme/i-1/", wantCancel: true},
		{name: "unsigned", sig: "", wantRefused: api.ECancelUnsigned},
		{name: "signed for another call", sig: "control:other/i-1/", wantRefused: api.ECancelUnsigned},
		{name: "asked by the call's agent", sig: "control:acme/i-1/did:a", by: "did:a", wantCancel: true},
		{name: "asked by another agent", sig: "control:acme/i-1/did:b", by: "did:b", wantRefused: api.ECancelNotOwn},
		{name: "signed for another asker", sig: "control:acme/i-1/", by: "did:a", wantRefused: api.ECancelUnsigned},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := newFakeStore()
			st.records["i-1"] = api.Record{InvocationID: "i-1", Tenant: "acme", CancelRequested: true, CancelSig: c.sig, CancelBy: c.by}
			var refused []string
			x := &Executor{reg: reg, builtins: builtins, store: st, running: NewRunning(), CancelSigned: signed,
				Refused: func(_ context.Context, what string, _ uint64, cause error) {
					if !errors.Is(cause, &api.Error{Code: api.PermissionDenied, ECode: c.wantRefused}) {
						t.Errorf("refusal %v, want %s", cause, c.wantRefused)
					}
					refused = append(refused, what)
				}}
			inv := &envelope.Invocation{ID: "i-1", Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: 5},
				Request: &api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"x":1}`), AgentContext: api.AgentContext{AgentDID: "did:a"}},
				Route:   &envelope.Route{ToolID: "echo", ToolVersion: "1.0.0", Executor: "builtin"}}
			_, err := x.Process(context.Background(), inv)
			var ae *api.Error
			if cancelled := errors.As(err, &ae) && ae.ECode == api.ECancelled; cancelled != c.wantCancel {
				t.Fatalf("cancelled: %v, want %v (%v)", cancelled, c.wantCancel, err)
			}
			if !c.wantCancel && (err != nil || string(inv.Result) != `{"x":1}`) {
				t.Fatalf("the call did not run: %v %s", err, inv.Result)
			}
			if (len(refused) > 0) != (c.wantRefused != "") {
				t.Fatalf("refusals %v, want %q", refused, c.wantRefused)
			}
		})
	}
}
