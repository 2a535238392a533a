// Package doctest is a document server for tests: a Model Context
// Protocol server written with the official Go SDK that serves versioned
// documents as resources (docs://<id>, and docs://<id>/v/<version> for one
// version), announces changes to subscribers, searches by word, and fails
// on demand. It listens on streamable HTTP at a loopback address.
package doctest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Server is a running document server.
type Server struct {
	// URL is its streamable-HTTP endpoint.
	URL string
	// Reads counts resources/read requests that reached it, Batches calls
	// of its get_documents tool.
	Reads, Batches atomic.Int64

	mcp  *mcp.Server
	http *httptest.Server

	mu      sync.Mutex
	docs    map[string][]string // id -> contents by version (v1, v2, ...)
	removed map[string]bool     // "id/vN" no longer served
	failing bool
	delay   time.Duration
	subs    map[string]int
	stopped bool
}

// Start starts a server holding docs (id -> content, version v1 each).
func Start(docs map[string]string) *Server {
	s := &Server{docs: map[string][]string{}, removed: map[string]bool{}, subs: map[string]int{}}
	for id, c := range docs {
		s.docs[id] = []string{c}
	}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "doctest", Version: "1"}, &mcp.ServerOptions{
		SubscribeHandler: func(_ context.Context, req *mcp.SubscribeRequest) error {
			s.mu.Lock()
			s.subs[req.Params.URI]++
			s.mu.Unlock()
			return nil
		},
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
	})
	s.mcp.AddResourceTemplate(&mcp.ResourceTemplate{Name: "document", URITemplate: "docs://{id}"}, s.read)
	s.mcp.AddResourceTemplate(&mcp.ResourceTemplate{Name: "document-version", URITemplate: "docs://{id}/v/{version}"}, s.read)
	type searchIn struct {
		Query string `json:"query"`
		Limit int    `json:"limit,omitempty"`
	}
	type hit struct {
		ID string `json:"id"`
	}
	type searchOut struct {
		Documents []hit `json:"documents"`
	}
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "search_documents", Description: "documents whose latest text holds the query"},
		func(_ context.Context, _ *mcp.CallToolRequest, in searchIn) (*mcp.CallToolResult, searchOut, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			out := searchOut{Documents: []hit{}}
			for id, vs := range s.docs {
				if strings.Contains(vs[len(vs)-1], in.Query) {
					out.Documents = append(out.Documents, hit{ID: id})
				}
			}
			return nil, out, nil
		})
	type fetchIn struct {
		DocumentIDs []string          `json:"document_ids"`
		Versions    map[string]string `json:"versions,omitempty"`
	}
	type doc struct {
		ID       string `json:"id"`
		Version  string `json:"version"`
		MIMEType string `json:"mime_type"`
		Content  string `json:"content"`
	}
	type fetchOut struct {
		Documents []doc `json:"documents"`
	}
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "get_documents", Description: "several documents at once, latest or at a version"},
		func(_ context.Context, _ *mcp.CallToolRequest, in fetchIn) (*mcp.CallToolResult, fetchOut, error) {
			s.Batches.Add(1)
			s.mu.Lock()
			defer s.mu.Unlock()
			out := fetchOut{Documents: []doc{}}
			for _, id := range in.DocumentIDs {
				vs, ok := s.docs[id]
				if !ok {
					continue
				}
				n := len(vs)
				if v := in.Versions[id]; v != "" {
					if _, err := fmt.Sscanf(v, "v%d", &n); err != nil || n < 1 || n > len(vs) || s.removed[id+"/"+v] {
						continue
					}
				}
				out.Documents = append(out.Documents, doc{ID: id, Version: fmt.Sprintf("v%d", n), MIMEType: "text/markdown", Content: vs[n-1]})
			}
			return nil, out, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp }, nil)
	s.http = httptest.NewServer(h)
	s.URL = s.http.URL
	return s
}

func (s *Server) read(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	s.Reads.Add(1)
	uri := req.Params.URI
	s.mu.Lock()
	failing, delay := s.failing, s.delay
	s.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if failing {
		return nil, fmt.Errorf("the document store is failing on purpose")
	}
	rest, ok := strings.CutPrefix(uri, "docs://")
	if !ok {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	id, version, versioned := strings.Cut(rest, "/v/")
	s.mu.Lock()
	defer s.mu.Unlock()
	vs, ok := s.docs[id]
	if !ok {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	n := len(vs)
	if versioned {
		if _, err := fmt.Sscanf(version, "v%d", &n); err != nil || n < 1 || n > len(vs) || s.removed[id+"/"+version] {
			return nil, mcp.ResourceNotFoundError(uri)
		}
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{
		URI: uri, MIMEType: "text/markdown", Text: vs[n-1], Meta: mcp.Meta{"version": fmt.Sprintf("v%d", n)},
	}}}, nil
}

// Update adds a new version of id (created if new) and announces the
// change to subscribers; it returns the new version.
func (s *Server) Update(id, content string) string {
	s.mu.Lock()
	s.docs[id] = append(s.docs[id], content)
	v := fmt.Sprintf("v%d", len(s.docs[id]))
	s.mu.Unlock()
	_ = s.mcp.ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationParams{URI: "docs://" + id})
	return v
}

// Remove stops serving one version of id.
func (s *Server) Remove(id, version string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removed[id+"/"+version] = true
}

// Fail makes reads fail (true) or succeed again.
func (s *Server) Fail(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failing = on
}

// Delay holds every read for d.
func (s *Server) Delay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}

// Subscribers counts subscriptions to uri.
func (s *Server) Subscribers(uri string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.subs[uri]
}

// Stop shuts the server down: its connections are closed and new ones
// refused.
func (s *Server) Stop() {
	s.mu.Lock()
	stopped := s.stopped
	s.stopped = true
	s.mu.Unlock()
	if !stopped {
		s.http.CloseClientConnections()
		s.http.Close()
	}
}

// Source is the source document that declares this server as name.
func (s *Server) Source(name string) string {
	return fmt.Sprintf(`{"name":%q,"url":%q,"resource_uri":"docs://{id}","versioned_uri":"docs://{id}/v/{version}","search_tool":"search_documents","request_timeout_ms":2000}`,
		name, s.URL+"/")
}
