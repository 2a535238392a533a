package modeltool

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/internal/tools"
)

// TestDocumentsJoinTheSystemPrompt: a model tool is handed its documents
// in the model's context, and the parameter itself is not sent on.
func TestDocumentsJoinTheSystemPrompt(t *testing.T) {
	m := tools.Manifest{ID: "t.llm", Version: "1.0.0", Kind: "model",
		Documents: &tools.Documents{Parameter: "docs"}}.WithSpec(json.RawMessage(`{}`))
	c := &call{m: m, spec: &Spec{}}
	p, err := c.params(json.RawMessage(`{"prompt":"which door?","system":"Be brief.",
		"docs":[{"document_id":"guide","version":"v2","source":"handbook","content":"use the side door"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(p.System, "Be brief.") || !strings.Contains(p.System, `<document id="guide" version="v2" source="handbook">`) ||
		!strings.Contains(p.System, "use the side door") {
		t.Fatalf("system %q", p.System)
	}
	if _, err := (&call{m: manifest, spec: &Spec{}}).params(json.RawMessage(`{"prompt":"x","docs":[]}`)); err == nil {
		t.Fatal("a tool that takes no documents accepted a docs parameter")
	}
}
