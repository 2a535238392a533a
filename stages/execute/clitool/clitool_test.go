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
	echo := tools.Manifest{ID: "t:echo", Version: "1.0.0", Kind: "cli"}.
		WithSpec(json.RawMessage(`{"command":["sh","-c","echo '{\"ok\":true}'"],"stdin":"none"}`))
	noJSON := tools.Manifest{ID: "t:text", Version: "1.0.0", Kind: "cli"}.
		WithSpec(json.RawMessage(`{"command":["sh","-c","echo plain"],"stdin":"none"}`))
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

// TestDocumentFiles: the documents handed in the manifest's documents
// parameter are read-only files under $TOOLGATE_DOCS, with an index.
func TestDocumentFiles(t *testing.T) {
	modes := []sandbox.Config{{Mode: sandbox.ModeNone}}
	if sandbox.Available() == nil {
		modes = append(modes, sandbox.Config{})
	}
	m := tools.Manifest{ID: "t:docs", Version: "1.0.0", Kind: "cli", Documents: &tools.Documents{Parameter: "docs"}}.
		WithSpec(json.RawMessage(`{"command":["sh","-c","c=$(cat \"$TOOLGATE_DOCS\"/01-guide); ` +
			`if echo x > \"$TOOLGATE_DOCS\"/new 2>/dev/null; then w=yes; else w=no; fi; ` +
			`grep -q '\"document_id\":\"guide\"' \"$TOOLGATE_DOCS\"/index.json && i=yes; echo \"{\\\"c\\\":\\\"$c\\\",\\\"w\\\":\\\"$w\\\",\\\"i\\\":\\\"$i\\\"}\""],"stdin":"none"}`))
	params := json.RawMessage(`{"docs":[{"document_id":"guide","version":"v1","source":"h","content":"side door"}]}`)
	for _, cfg := range modes {
		t.Run(cfg.Mode, func(t *testing.T) {
			inv := &envelope.Invocation{ID: "i", Tenant: "acme", Request: &api.Request{Parameters: params}}
			fn, err := (&Kind{Sandbox: cfg}).Prepare(m, inv)
			if err != nil {
				t.Fatal(err)
			}
			out, err := fn(context.Background(), params)
			if err != nil || string(out) != `{"c":"side door","w":"no","i":"yes"}` {
				t.Fatalf("got %s, %v", out, err)
			}
		})
	}
}
