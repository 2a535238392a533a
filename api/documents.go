package api

import "encoding/json"

// DocumentAccess is one document a call read: what the response's
// execution_metadata.documents_accessed and the audit trail record (ids,
// versions and sizes, never content).
type DocumentAccess struct {
	DocumentID string `json:"document_id"`
	Version    string `json:"document_version"`
	Source     string `json:"source"`
	Bytes      int    `json:"bytes"`
	// Cached says the content came from the document cache, not the source.
	Cached bool `json:"cached,omitempty"`
	// AccessCount is how many times the call read the document.
	AccessCount int `json:"access_count"`
}

// DocumentPin is the version of a document a call is held to: with
// document_context.version_pinning, every read of the document in the
// call (and in a resumed or retried run of it) gets exactly this version.
type DocumentPin struct {
	Source     string `json:"source"`
	DocumentID string `json:"document_id"`
	Version    string `json:"version"`
}

// DocSourceRequest adds (Source, a source document) or names (Name, for
// remove) a document source.
type DocSourceRequest struct {
	Source json.RawMessage `json:"source,omitempty"`
	Name   string          `json:"name,omitempty"`
	By     string          `json:"by,omitempty"`
}

// DocSourcesResponse lists the declared document sources.
type DocSourcesResponse struct {
	Sources []json.RawMessage `json:"sources"`
}
