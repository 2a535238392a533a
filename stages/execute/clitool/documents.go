package clitool

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/tools"
)

// DocsPath is where a cli tool finds the documents of its call's
// document_context, read-only: one file per document and index.json
// listing them; TOOLGATE_DOCS names the directory.
const DocsPath = "/docs"

// handedDoc is one document as the execute stage puts it in the
// manifest's documents parameter.
type handedDoc struct {
	DocumentID    string `json:"document_id"`
	Version       string `json:"version"`
	Source        string `json:"source"`
	MIMEType      string `json:"mime_type,omitempty"`
	Content       string `json:"content,omitempty"`
	ContentBase64 []byte `json:"content_base64,omitempty"`
}

// docFiles writes the documents in params (m's documents parameter) into
// a fresh directory the sandbox binds read-only at DocsPath. dir is ""
// when the call was handed no documents; remove deletes the directory.
func docFiles(m *tools.Manifest, params json.RawMessage) (dir string, remove func(), err error) {
	remove = func() {}
	if m.Documents == nil {
		return "", remove, nil
	}
	var p map[string]json.RawMessage
	if json.Unmarshal(params, &p) != nil || len(p[m.Documents.Parameter]) == 0 {
		return "", remove, nil
	}
	var docs []handedDoc
	if err := json.Unmarshal(p[m.Documents.Parameter], &docs); err != nil || len(docs) == 0 {
		return "", remove, nil
	}
	dir, err = os.MkdirTemp("", "toolgate-docs-")
	if err != nil {
		return "", remove, docErr(err)
	}
	remove = func() { _ = os.RemoveAll(dir) }
	type entry struct {
		File       string `json:"file"`
		DocumentID string `json:"document_id"`
		Version    string `json:"version"`
		Source     string `json:"source"`
		MIMEType   string `json:"mime_type,omitempty"`
	}
	index := make([]entry, 0, len(docs))
	for i, d := range docs {
		body := []byte(d.Content)
		if d.ContentBase64 != nil {
			body = d.ContentBase64
		}
		name := fmt.Sprintf("%02d-%s", i+1, fileName(d.DocumentID))
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o444); err != nil {
			remove()
			return "", func() {}, docErr(err)
		}
		index = append(index, entry{File: name, DocumentID: d.DocumentID, Version: d.Version, Source: d.Source, MIMEType: d.MIMEType})
	}
	b, _ := json.Marshal(index)
	if err := os.WriteFile(filepath.Join(dir, "index.json"), b, 0o444); err != nil {
		remove()
		return "", func() {}, docErr(err)
	}
	// The tool runs as another user: it reads, never writes.
	if err := os.Chmod(dir, 0o555); err != nil {
		remove()
		return "", func() {}, docErr(err)
	}
	return dir, func() { _ = os.Chmod(dir, 0o755); _ = os.RemoveAll(dir) }, nil
}

// withDocs binds dir read-only at DocsPath (or, with no sandbox, names
// dir itself) and sets TOOLGATE_DOCS.
func withDocs(cfg sandbox.Config, spec sandbox.Spec, dir string) sandbox.Spec {
	env := make(map[string]string, len(spec.Env)+1)
	for k, v := range spec.Env {
		env[k] = v
	}
	if cfg.Mode == sandbox.ModeNone {
		env["TOOLGATE_DOCS"] = dir
	} else {
		env["TOOLGATE_DOCS"] = DocsPath
		spec.Mounts = append(append([]sandbox.Mount{}, spec.Mounts...), sandbox.Mount{Host: dir, Path: DocsPath})
	}
	spec.Env = env
	return spec
}

// fileName keeps a document id readable as one file name.
func fileName(id string) string {
	s := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
			return r
		}
		return '_'
	}, id)
	s = strings.TrimLeft(s, ".")
	if len(s) > 100 {
		s = s[len(s)-100:]
	}
	if s == "" {
		s = base64.RawURLEncoding.EncodeToString([]byte(id))[:min(16, len(id)+1)]
	}
	return s
}

func docErr(err error) error {
	return api.WrapError(err, api.SandboxFailure, api.EExecutorUnavailable, "preparing the documents' files: %v", err).
		WithDetail("not_started", true)
}
