package documents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/api"
)

// fetched is one document of a batched fetch, or why it failed.
type fetched struct {
	d   Document
	err error
}

// BatchResult is what a source's fetch tool answers as structured content.
type BatchResult struct {
	Documents []struct {
		ID            string         `json:"id"`
		Version       string         `json:"version"`
		MIMEType      string         `json:"mime_type,omitempty"`
		Content       *string        `json:"content,omitempty"`
		ContentBase64 []byte         `json:"content_base64,omitempty"`
		Meta          map[string]any `json:"_meta,omitempty"`
	} `json:"documents"`
}

// DecodeBatch reads a fetch tool's structured result.
func DecodeBatch(v any) (*BatchResult, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var r BatchResult
	if err := json.Unmarshal(raw, &r); err != nil || r.Documents == nil {
		return nil, errors.New(`the structured result is not {"documents": [{"id", "version", "content"}]}`)
	}
	for _, d := range r.Documents {
		if d.ID == "" || d.Version == "" || (d.Content == nil && d.ContentBase64 == nil) {
			return nil, errors.New("a document lacks its id, version or content")
		}
	}
	return &r, nil
}

// fetchBatch reads refs from src with one call of its fetch tool
// (get_source_of_truth for many documents at once):
// {"document_ids": [...], "versions": {"<id>": "<version>"}}. A document
// the answer lacks does not exist (or not at the version asked).
func (b *Bridge) fetchBatch(ctx context.Context, src *source, refs []Ref) map[Ref]fetched {
	out := make(map[Ref]fetched, len(refs))
	all := func(err error) map[Ref]fetched {
		for _, r := range refs {
			out[r] = fetched{err: err}
		}
		return out
	}
	spec := src.spec
	ctx, cancel := context.WithTimeout(ctx, spec.timeout())
	defer cancel()
	sess, err := b.session(ctx, src)
	if err != nil {
		return all(err)
	}
	ids := make([]string, 0, len(refs))
	versions := map[string]string{}
	for _, r := range refs {
		ids = append(ids, r.ID)
		if r.Version != "" {
			versions[r.ID] = r.Version
		}
	}
	res, err := sess.Client().CallTool(ctx, &mcp.CallToolParams{Name: spec.FetchTool,
		Arguments: map[string]any{"document_ids": ids, "versions": versions}})
	if err != nil {
		err = b.readErr(ctx, spec, Ref{ID: fmt.Sprintf("%d documents", len(refs))}, sess, err)
		if isDown(err) {
			src.drop(sess)
		}
		return all(err)
	}
	if res.IsError {
		return all(protocol(spec.Name, "fetch tool %s failed", spec.FetchTool))
	}
	batch, err := DecodeBatch(res.StructuredContent)
	if err != nil {
		return all(protocol(spec.Name, "fetch tool %s: %v", spec.FetchTool, err))
	}
	for _, r := range refs {
		f := fetched{err: notFound(fmt.Sprintf("document %s does not exist at source %s", r.ID, spec.Name))}
		if r.Version != "" {
			f.err = api.NewError(api.DocumentVersionConflict, api.EDocVersionConflict,
				"document %s of source %s: version %s is no longer served", r.ID, spec.Name, r.Version).
				WithDetail("not_started", true).WithDetail("document_id", r.ID).WithDetail("version", r.Version)
		}
		for _, d := range batch.Documents {
			if d.ID != r.ID || (r.Version != "" && d.Version != r.Version) {
				continue
			}
			c := &mcp.ResourceContents{MIMEType: d.MIMEType, Blob: d.ContentBase64, Meta: mcp.Meta{"version": d.Version}}
			if d.Content != nil {
				c.Text, c.Blob = *d.Content, nil
			}
			doc, err := decodeContents(spec, r, &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{c}})
			f = fetched{d: doc, err: err}
		}
		out[r] = f
	}
	return out
}
