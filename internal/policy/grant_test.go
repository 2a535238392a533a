package policy

import (
	"context"
	"testing"
)

// TestGrants: the shipped rule grants safe candidates; an operator's
// module replaces it; a policy without the rule keeps the shipped one.
func TestGrants(t *testing.T) {
	ctx := context.Background()
	input := map[string]any{
		"request":    map[string]any{"constraints": map[string]any{"max_runtime_ms": 1000}},
		"candidates": []any{map[string]any{"tool_id": "a", "risk_level": "low", "side_effects": []any{}, "requires_approval": false}},
	}
	def, err := DefaultGrants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g, err := def.Eval(ctx, input)
	if err != nil || !g.Allow || len(g.Tools) != 1 || g.MaxCalls != 4 || g.TTLSeconds != 900 {
		t.Fatalf("shipped grant = %+v, %v", g, err)
	}
	deny := "package toolgate.capability\n\ngrant := {\"allow\": false, \"reasons\": [\"closed\"], \"tools\": []}\n"
	own, err := NewGrants(ctx, map[string]string{"c.rego": deny}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if g, err := own.Eval(ctx, input); err != nil || g.Allow || g.Reasons[0] != "closed" {
		t.Fatalf("operator grant = %+v, %v", g, err)
	}
	empty := "package toolgate.capability\n\ngrant := {\"allow\": true, \"tools\": []}\n"
	own, _ = NewGrants(ctx, map[string]string{"c.rego": empty}, nil)
	if g, _ := own.Eval(ctx, input); g.Allow {
		t.Fatalf("a grant of no tools allowed: %+v", g)
	}
	authzOnly, err := NewGrants(ctx, map[string]string{"default.rego": DefaultModule()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if g, _ := authzOnly.Eval(ctx, input); !g.Allow {
		t.Fatalf("a policy without the grant rule lost the shipped one: %+v", g)
	}
}
