package mcptool_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages/execute/mcptool"
)

// FuzzResult: whatever a server answers, decoded as the SDK decodes it,
// becomes a JSON object for verify or a coded error, never a panic.
func FuzzResult(f *testing.F) {
	for _, s := range []string{
		`{"content":[{"type":"text","text":"hi"}]}`,
		`{"content":[],"structuredContent":{"sum":3}}`,
		`{"content":[{"type":"text","text":"boom"}],"isError":true}`,
		`{"content":[{"type":"image","data":"AAAA","mimeType":"image/png"}]}`,
		`{"content":[{"type":"resource","resource":{"uri":"file:///x","text":"t"}}]}`,
		`{"structuredContent":[1,2,3]}`, `{}`, `null`,
	} {
		f.Add([]byte(s))
	}
	m, err := tools.Parse([]byte(`{"id":"mcp:fz:t","name":"t","version":"1.0.0","description":"d","kind":"mcp",
	  "mcp":{"server":"fz","tool":"t","command":["true"]},"input_schema":{"type":"object"}}`))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, answer []byte) {
		var res mcp.CallToolResult
		if err := json.Unmarshal(answer, &res); err != nil {
			return // the SDK refuses it before we see it
		}
		out, err := mcptool.Result(m, &res)
		if err != nil {
			var te *api.Error
			if !errors.As(err, &te) || te.ECode == "" {
				t.Fatalf("uncoded error %v", err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("result is not JSON: %s", out)
		}
	})
}
