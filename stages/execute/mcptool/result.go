package mcptool

import (
	"encoding/json"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/tools"
)

// maxErrorText bounds the server's text carried in an error message.
const maxErrorText = 2000

// Result turns a tool's answer into the invocation's result: its structured
// content when it has some (that is what an output schema describes),
// otherwise {"content": [...]} with the content items as the protocol
// writes them. A result with isError is a tool execution error (E3108)
// carrying the server's text. Verify checks either against the manifest's
// output schema and output policy: nothing here trusts the server.
func Result(m *tools.Manifest, res *mcp.CallToolResult) (json.RawMessage, error) {
	if res.IsError {
		return nil, api.NewError(api.ToolExecutionError, api.EToolFailed, "%s failed: %s", m.Key(), errorText(res))
	}
	if res.StructuredContent != nil {
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			return nil, api.WrapError(err, api.ToolExecutionError, api.EResultNotJSON,
				"%s: structured content does not encode: %v", m.Key(), err)
		}
		return b, nil
	}
	content := res.Content
	if content == nil {
		content = []mcp.Content{}
	}
	b, err := json.Marshal(struct {
		Content []mcp.Content `json:"content"`
	}{content})
	if err != nil {
		return nil, api.WrapError(err, api.ToolExecutionError, api.EResultNotJSON,
			"%s: content does not encode: %v", m.Key(), err)
	}
	return b, nil
}

// errorText is the text items of a failed call, joined.
func errorText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	s := strings.Join(parts, "\n")
	if s == "" {
		s = "the server gave no text"
	}
	if len(s) > maxErrorText {
		s = s[:maxErrorText] + "…"
	}
	return s
}
