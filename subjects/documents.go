package subjects

import "strings"

// Document bridge names (docs/documents.md).
const (
	// BucketDocSources holds the operator-declared document sources, one
	// entry per source name, each signed by the operator who added it.
	BucketDocSources = "toolgate_docsources"
	// BucketDocCache holds fetched documents: the latest version of a
	// document for a short time, immutable versions longer.
	BucketDocCache = "toolgate_doccache"

	// SvcDocsSourceAdd takes api.DocSourceRequest (source), SvcDocsSourceList
	// {}, SvcDocsSourceRemove api.DocSourceRequest (name). Operators only.
	SvcDocsSourceAdd    = "tool.svc.docs.source.add"
	SvcDocsSourceList   = "tool.svc.docs.source.list"
	SvcDocsSourceRemove = "tool.svc.docs.source.remove"
)

const docsUpdatedPrefix = "toolgate.docs.updated."

// DocsUpdated is where a change to a document of source is announced, for
// every worker to drop its cached copy (body: {"document_id": "..."}; an
// empty body drops the source's whole cache).
func DocsUpdated(source string) string { return docsUpdatedPrefix + Token(source) }

// DocsUpdatedAll matches every announcement of DocsUpdated.
const DocsUpdatedAll = docsUpdatedPrefix + "*"

// SourceOfDocsUpdated returns the source an announcement is about.
func SourceOfDocsUpdated(subject string) (string, bool) {
	tok, ok := strings.CutPrefix(subject, docsUpdatedPrefix)
	if !ok || tok == "" || strings.ContainsAny(tok, ".*>") {
		return "", false
	}
	s, err := Untoken(tok)
	return s, err == nil
}
