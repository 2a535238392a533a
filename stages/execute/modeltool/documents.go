package modeltool

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/toolgate/toolgate/internal/tools"
)

// handedDoc is one document the execute stage put in the manifest's
// documents parameter.
type handedDoc struct {
	DocumentID string `json:"document_id"`
	Version    string `json:"version"`
	Source     string `json:"source"`
	Content    string `json:"content,omitempty"`
}

// withDocuments takes the documents out of raw (m's documents parameter)
// and returns the rest, with the documents as text for the model's system
// prompt: a model tool is handed documents in its context. Binary
// documents are left out: a model is sent text.
func withDocuments(m *tools.Manifest, raw json.RawMessage) (json.RawMessage, string, error) {
	if m == nil || m.Documents == nil || len(bytes.TrimSpace(raw)) == 0 {
		return raw, "", nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return raw, "", nil // the parameters' own decode reports it
	}
	docsRaw, ok := obj[m.Documents.Parameter]
	if !ok {
		return raw, "", nil
	}
	delete(obj, m.Documents.Parameter)
	rest, err := json.Marshal(obj)
	if err != nil {
		return nil, "", err
	}
	var docs []handedDoc
	if err := json.Unmarshal(docsRaw, &docs); err != nil {
		return nil, "", badParams("%s: not the documents toolgate hands: %v", m.Documents.Parameter, err)
	}
	var b strings.Builder
	for _, d := range docs {
		if d.Content == "" {
			continue
		}
		fmt.Fprintf(&b, "<document id=%q version=%q source=%q>\n%s\n</document>\n", d.DocumentID, d.Version, d.Source, d.Content)
	}
	if b.Len() == 0 {
		return rest, "", nil
	}
	return rest, "Authoritative documents for this task:\n" + b.String(), nil
}
