// Package documents is the document bridge: it resolves a call's
// document_context before the tool runs. Documents come from sources an
// operator declares (toolgate docs source add), each a Model Context
// Protocol server reached with the official Go SDK, over stdio (a server
// process started in the sandbox, as mcp tools' servers are) or over
// streamable HTTP. Every document is checked against the document policy
// (Rego), fetched, cached in KV, and handed to the tool in the parameter
// its manifest declares.
package documents

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/toolgate/toolgate/stages/execute/mcptool"
)

// Source is a declared document source: the document an operator adds.
type Source struct {
	// Name names the source in document refs ("handbook:doc-1").
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Command starts a stdio server in the sandbox (argv, no shell), with
	// Env and the host paths it needs bound read-only.
	Command       []string          `json:"command,omitempty"`
	Env           map[string]string `json:"env,omitempty"`
	ReadOnlyPaths []string          `json:"read_only_paths,omitempty"`
	// URL reaches a streamable-HTTP server instead.
	URL string `json:"url,omitempty"`
	// ResourceURI maps get_source_of_truth onto resources/read: the URI
	// of a document's latest version, with {id} for the document id
	// (default "{id}": ids are URIs).
	ResourceURI string `json:"resource_uri,omitempty"`
	// VersionedURI is the URI of one version, with {id} and {version}.
	// Without it a version is checked against the latest's.
	VersionedURI string `json:"versioned_uri,omitempty"`
	// FetchTool maps get_source_of_truth onto one tool call for all the
	// documents a call needs from this source (instead of resources/read
	// per document): {"document_ids": [...], "versions": {"<id>": "<v>"}},
	// answered {"documents": [{"id", "version", "content" or
	// "content_base64", "mime_type"}]} as structured content.
	FetchTool string `json:"fetch_tool,omitempty"`
	// SearchTool maps search_documents onto a tool of the server, called
	// with {"query": q, "limit": n}; it answers
	// {"documents": [{"id": ...}]} as structured content.
	SearchTool string `json:"search_tool,omitempty"`
	// Tenants are the tenants the source serves; empty serves all. The
	// shipped document policy enforces it.
	Tenants []string `json:"tenants,omitempty"`
	// RequestTimeoutMS bounds one request to the server (default 30000).
	RequestTimeoutMS int `json:"request_timeout_ms,omitempty"`
	// MaxDocumentBytes bounds one document (default 512 KiB: a cache entry
	// keeps it base64-encoded, and must fit the server's max payload).
	MaxDocumentBytes int `json:"max_document_bytes,omitempty"`
	// HotTTLSeconds is how long the latest version of a document is
	// served from the cache (default 300); immutable versions are kept a
	// day.
	HotTTLSeconds int `json:"hot_ttl_seconds,omitempty"`
}

// Defaults.
const (
	DefaultRequestTimeout   = 30 * time.Second
	DefaultMaxDocumentBytes = 512 << 10
	DefaultHotTTL           = 5 * time.Minute
	// DefaultMaxBytes is a call's total when the manifest sets none.
	DefaultMaxBytes = 256 << 10
	// MaxSearchResults is how many documents a query adds.
	MaxSearchResults = 5
)

var sourceName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

// Decode reads and checks a source document. Unknown fields are refused:
// a misspelt mapping would silently serve nothing.
func Decode(doc []byte) (*Source, error) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.DisallowUnknownFields()
	var s Source
	if err := d.Decode(&s); err != nil {
		return nil, fmt.Errorf("source document: %v", err)
	}
	if d.More() {
		return nil, fmt.Errorf("source document: trailing data")
	}
	return &s, s.check()
}

func (s *Source) check() error {
	switch {
	case !sourceName.MatchString(s.Name):
		return fmt.Errorf("name %q must match %s", s.Name, sourceName)
	case (len(s.Command) == 0) == (s.URL == ""):
		return fmt.Errorf("exactly one of command and url must be set")
	case s.RequestTimeoutMS < 0 || s.MaxDocumentBytes < 0 || s.HotTTLSeconds < 0:
		return fmt.Errorf("request_timeout_ms, max_document_bytes and hot_ttl_seconds must be positive")
	case s.ResourceURI != "" && !strings.Contains(s.ResourceURI, "{id}"):
		return fmt.Errorf("resource_uri %q has no {id}", s.ResourceURI)
	case s.VersionedURI != "" && (!strings.Contains(s.VersionedURI, "{id}") || !strings.Contains(s.VersionedURI, "{version}")):
		return fmt.Errorf("versioned_uri %q needs {id} and {version}", s.VersionedURI)
	}
	for _, p := range s.ReadOnlyPaths {
		if err := mcptool.CheckReadOnlyPath(p); err != nil {
			return err
		}
	}
	if s.URL != "" {
		if err := mcptool.CheckURL(s.URL); err != nil {
			return err
		}
	}
	return nil
}

func (s *Source) timeout() time.Duration {
	if s.RequestTimeoutMS > 0 {
		return time.Duration(s.RequestTimeoutMS) * time.Millisecond
	}
	return DefaultRequestTimeout
}

func (s *Source) maxDocument() int {
	if s.MaxDocumentBytes > 0 {
		return s.MaxDocumentBytes
	}
	return DefaultMaxDocumentBytes
}

func (s *Source) hotTTL() time.Duration {
	if s.HotTTLSeconds > 0 {
		return time.Duration(s.HotTTLSeconds) * time.Second
	}
	return DefaultHotTTL
}

// uri is the URI of document id, at version when it is not "".
func (s *Source) uri(id, version string) string {
	if version != "" && s.VersionedURI != "" {
		return strings.NewReplacer("{id}", id, "{version}", version).Replace(s.VersionedURI)
	}
	if s.ResourceURI == "" {
		return id
	}
	return strings.ReplaceAll(s.ResourceURI, "{id}", id)
}

// idOf is the document id a resource URI names, for invalidation: the
// inverse of uri for the latest version.
func (s *Source) idOf(uri string) (string, bool) {
	tpl := s.ResourceURI
	if tpl == "" {
		return uri, true
	}
	pre, post, _ := strings.Cut(tpl, "{id}")
	if !strings.HasPrefix(uri, pre) || !strings.HasSuffix(uri, post) || len(uri) < len(pre)+len(post)+1 {
		return "", false
	}
	return uri[len(pre) : len(uri)-len(post)], true
}

// Ref is one document reference of document_context:
// [source:]id[@version].
type Ref struct {
	Source, ID, Version string
}

// ParseRef reads a reference against the declared source names. The
// source prefix may be left out when exactly one source is declared (only
// then: a guess among several would read the wrong document). A version
// follows the last "@" when what follows has no "/" or ":" (ids may be
// URIs that hold an "@").
func ParseRef(ref string, sources []string) (Ref, error) {
	if ref == "" || len(ref) > 512 || strings.ContainsAny(ref, "\x00\n\r") {
		return Ref{}, fmt.Errorf("document ref %q is empty, too long or holds control characters", ref)
	}
	var r Ref
	if name, rest, ok := strings.Cut(ref, ":"); ok && contains(sources, name) {
		r.Source, ref = name, rest
	} else if len(sources) == 1 {
		r.Source = sources[0]
	} else if len(sources) == 0 {
		return Ref{}, fmt.Errorf("document ref %q: no document source is declared", ref)
	} else {
		return Ref{}, fmt.Errorf("document ref %q names none of the sources %s", ref, strings.Join(sources, ", "))
	}
	if i := strings.LastIndexByte(ref, '@'); i > 0 && i < len(ref)-1 && !strings.ContainsAny(ref[i+1:], "/:") {
		r.ID, r.Version = ref[:i], ref[i+1:]
	} else {
		r.ID = ref
	}
	if r.ID == "" {
		return Ref{}, fmt.Errorf("document ref names no document")
	}
	return r, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
