package clitool

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/tools"
)

func TestPrepare(t *testing.T) {
	echo := &tools.Manifest{ID: "t:echo", Version: "1.0.0", Kind: "cli",
		CLI: json.RawMessage(`{"command":["sh","-c","echo '{\"ok\":true}'"],"stdin":"none"}`)}
	noJSON := &tools.Manifest{ID: "t:text", Version: "1.0.0", Kind: "cli",
		CLI: json.RawMessage(`{"command":["sh","-c","echo plain"],"stdin":"none"}`)}
	cases := []struct {
		name       string
		kind       *Kind
		m          *tools.Manifest
		wantECode  string // of Prepare, or of the run
		wantResult string
	}{
		{name: "refused without a sandbox", kind: &Kind{SandboxErr: errors.New("bwrap missing")}, m: echo,
			wantECode: api.EExecutorUnavailable},
		{name: "no cli configuration", kind: &Kind{Sandbox: sandbox.Config{Mode: sandbox.ModeNone}},
			m: &tools.Manifest{ID: "t:x", Version: "1.0.0", Kind: "cli"}, wantECode: api.EExecutorUnavailable},
		{name: "runs and returns stdout", kind: &Kind{Sandbox: sandbox.Config{Mode: sandbox.ModeNone}}, m: echo,
			wantResult: `{"ok":true}`},
		{name: "stdout that is not JSON", kind: &Kind{Sandbox: sandbox.Config{Mode: sandbox.ModeNone}}, m: noJSON,
			wantECode: api.EResultNotJSON},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			inv := &envelope.Invocation{ID: "i", Tenant: "acme", Request: &api.Request{Parameters: json.RawMessage(`{}`)}}
			fn, err := c.kind.Prepare(c.m, inv)
			var out json.RawMessage
			if err == nil {
				out, err = fn(context.Background(), inv.Request.Parameters)
			}
			if c.wantECode != "" {
				var ae *api.Error
				if !errors.As(err, &ae) || ae.ECode != c.wantECode {
					t.Fatalf("err %v, want %s", err, c.wantECode)
				}
				return
			}
			if err != nil || string(out) != c.wantResult {
				t.Fatalf("got %s, %v; want %s", out, err, c.wantResult)
			}
		})
	}
}
