package documents

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages/execute"
)

// ImmutableTTL is how long a fetched version is served from the cache: a
// version never changes, so only the cache's own age limit ends it.
const ImmutableTTL = kvstore.DocCacheMaxAge

// Document is one document handed to a tool.
type Document struct {
	DocumentID string `json:"document_id"`
	Version    string `json:"version"`
	Source     string `json:"source"`
	MIMEType   string `json:"mime_type,omitempty"`
	// Content is the text; a binary document comes as ContentBase64.
	Content       string `json:"content,omitempty"`
	ContentBase64 []byte `json:"content_base64,omitempty"`
	bytes         int
	cached        bool
}

// Resolve implements execute.Documents: every document of inv's
// document_context (its refs, then what its query finds) is checked
// against the document policy, read from the cache or its source, and put
// in the parameter m declares.
func (b *Bridge) Resolve(ctx context.Context, inv *envelope.Invocation, m *tools.Manifest, pins []api.DocumentPin) (execute.DocumentHandoff, error) {
	dc := inv.Request.DocumentContext
	names := b.Names()
	var refs []Ref
	for _, s := range dc.DocumentRefs {
		r, err := ParseRef(s, names)
		if err != nil {
			return execute.DocumentHandoff{}, notFound(err.Error())
		}
		refs = append(refs, r)
	}
	var warnings []string
	if dc.Query != "" {
		found, err := b.search(ctx, dc.Query, names)
		if err != nil {
			return execute.DocumentHandoff{}, err
		}
		refs = append(refs, found...)
	}
	var docs []Document
	access := map[[3]string]int{}
	total, limit := 0, DefaultMaxBytes
	if m.Documents != nil && m.Documents.MaxBytes > 0 {
		limit = m.Documents.MaxBytes
	}
	// First every document is pinned, deduplicated and checked against
	// the policy, so that a denial reads nothing; then the sources that
	// map a batched fetch are asked once for all their documents.
	type item struct {
		r   Ref
		src *source
	}
	var items []item
	order := make([]int, 0, len(refs)) // refs[i] is items[order[i]]
	index := map[Ref]int{}
	for _, r := range refs {
		if r.Version == "" {
			for _, p := range pins {
				if p.Source == r.Source && p.DocumentID == r.ID {
					r.Version = p.Version
				}
			}
		}
		if i, dup := index[r]; dup {
			order = append(order, i)
			continue
		}
		src := b.source(r.Source)
		if src == nil {
			return execute.DocumentHandoff{}, notFound(fmt.Sprintf("document source %s is not declared", r.Source))
		}
		if err := b.allowed(ctx, inv, m, src.spec, r); err != nil {
			return execute.DocumentHandoff{}, err
		}
		index[r] = len(items)
		order = append(order, len(items))
		items = append(items, item{r, src})
	}
	batches := map[*source][]Ref{}
	batched := map[[2]string]bool{} // one version of an id per batch: versions are keyed by id
	for _, it := range items {
		if k := [2]string{it.r.Source, it.r.ID}; it.src.spec.FetchTool != "" && !batched[k] {
			batched[k] = true
			if c, ok, err := b.cfg.Store.CachedDoc(ctx, it.r.Source, it.r.ID, it.r.Version); err != nil || !ok || !b.cfg.Now().Before(c.Expires) {
				batches[it.src] = append(batches[it.src], it.r)
			}
		}
	}
	pre := map[Ref]fetched{}
	for src, rs := range batches {
		for r, f := range b.fetchBatch(ctx, src, rs) {
			pre[r] = f
		}
	}
	for _, it := range items {
		d, warn, err := b.get(ctx, it.src, it.r, pre)
		if err != nil {
			return execute.DocumentHandoff{}, err
		}
		warnings = append(warnings, warn...)
		total += d.bytes
		if total > limit {
			return execute.DocumentHandoff{}, api.NewError(api.ResourceExhausted, api.EDocTooLarge,
				"the documents of document_context exceed %s's limit of %d bytes", m.Key(), limit).
				WithDetail("not_started", true).WithDetail("max_bytes", limit)
		}
		docs = append(docs, d)
	}
	for _, i := range order {
		d := docs[i]
		access[[3]string{d.Source, d.DocumentID, d.Version}]++
	}
	h := execute.DocumentHandoff{Warnings: warnings}
	for _, d := range docs {
		h.Accessed = append(h.Accessed, api.DocumentAccess{DocumentID: d.DocumentID, Version: d.Version, Source: d.Source,
			Bytes: d.bytes, Cached: d.cached, AccessCount: access[[3]string{d.Source, d.DocumentID, d.Version}]})
		if dc.VersionPinning {
			h.Pins = append(h.Pins, api.DocumentPin{Source: d.Source, DocumentID: d.DocumentID, Version: d.Version})
		}
	}
	params, err := hand(inv.Request.Parameters, m.Documents.Parameter, docs)
	if err != nil {
		return execute.DocumentHandoff{}, err
	}
	h.Params = params
	return h, nil
}

// hand puts docs in params[parameter]; the caller's own value there is
// replaced, so an agent cannot pass off text as a source's document.
func hand(params json.RawMessage, parameter string, docs []Document) (json.RawMessage, error) {
	obj := map[string]json.RawMessage{}
	if len(bytes.TrimSpace(params)) > 0 && string(params) != "null" {
		if err := json.Unmarshal(params, &obj); err != nil {
			return nil, api.NewError(api.InvalidParameters, api.ERequestInvalid,
				"documents go in parameter %s, and the parameters are not an object", parameter).WithDetail("not_started", true)
		}
	}
	if docs == nil {
		docs = []Document{}
	}
	raw, err := json.Marshal(docs)
	if err != nil {
		return nil, err
	}
	obj[parameter] = raw
	return json.Marshal(obj)
}

// allowed asks the document policy about r.
func (b *Bridge) allowed(ctx context.Context, inv *envelope.Invocation, m *tools.Manifest, spec *Source, r Ref) error {
	ok, why, err := b.policy.Load().Allow(ctx, policy.DocumentInput{
		AgentDID: inv.Request.AgentContext.AgentDID, Tenant: inv.Tenant, ToolID: m.ID,
		Source: r.Source, SourceTenants: spec.Tenants, DocumentID: r.ID, Version: r.Version, AccessMode: "read"})
	if err != nil {
		return err
	}
	if !ok {
		return api.NewError(api.PermissionDenied, api.EDocDenied, "document %s of source %s is denied to %s: %s",
			r.ID, r.Source, inv.Request.AgentContext.AgentDID, strings.Join(why, "; ")).
			WithDetail("not_started", true).WithDetail("document_id", r.ID).WithDetail("source", r.Source)
	}
	return nil
}

// get reads r from the cache, else from its source. A version asked for
// (or pinned) is immutable: cached a day. The latest is cached for the
// source's hot TTL; when the source is down, an expired copy is served
// with a warning rather than nothing.
func (b *Bridge) get(ctx context.Context, src *source, r Ref, pre map[Ref]fetched) (Document, []string, error) {
	var warnings []string
	now := b.cfg.Now()
	cached, ok, cerr := b.cfg.Store.CachedDoc(ctx, r.Source, r.ID, r.Version)
	if cerr != nil {
		warnings = append(warnings, fmt.Sprintf("%s: the document cache is unavailable (%v); %s was read from its source",
			api.EDocCacheUnavailable, cerr, r.ID))
	}
	if ok && now.Before(cached.Expires) {
		return fromCache(r, cached), warnings, nil
	}
	var d Document
	var err error
	if f, batched := pre[r]; batched {
		d, err = f.d, f.err
	} else {
		d, err = b.fetch(ctx, src, r)
	}
	if err != nil {
		if ok && isDown(err) {
			return fromCache(r, cached), append(warnings, fmt.Sprintf("document %s of source %s is served from an expired cache entry: %v",
				r.ID, r.Source, err)), nil
		}
		return Document{}, warnings, err
	}
	if cerr == nil {
		entry := kvstore.CachedDoc{Version: d.Version, MIMEType: d.MIMEType, Content: content(d), Expires: now.Add(ImmutableTTL)}
		err := b.cfg.Store.CacheDoc(ctx, r.Source, r.ID, d.Version, entry)
		if err == nil && r.Version == "" {
			entry.Expires = now.Add(src.spec.hotTTL())
			err = b.cfg.Store.CacheDoc(ctx, r.Source, r.ID, "", entry)
		}
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("%s: %s was not cached: %v", api.EDocCacheUnavailable, r.ID, err))
		}
	}
	return d, warnings, nil
}

func content(d Document) []byte {
	if d.ContentBase64 != nil {
		return d.ContentBase64
	}
	return []byte(d.Content)
}

func fromCache(r Ref, c kvstore.CachedDoc) Document {
	d := Document{DocumentID: r.ID, Version: c.Version, Source: r.Source, MIMEType: c.MIMEType, bytes: len(c.Content), cached: true}
	setContent(&d, c.Content, utf8.Valid(c.Content))
	return d
}

func setContent(d *Document, b []byte, text bool) {
	if text {
		d.Content = string(b)
	} else {
		d.ContentBase64 = b
	}
}

// fetch reads r from its source with resources/read
// (get_source_of_truth).
func (b *Bridge) fetch(ctx context.Context, src *source, r Ref) (Document, error) {
	spec := src.spec
	ctx, cancel := context.WithTimeout(ctx, spec.timeout())
	defer cancel()
	sess, err := b.session(ctx, src)
	if err != nil {
		return Document{}, err
	}
	uri := spec.uri(r.ID, r.Version)
	res, err := sess.Client().ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
	if err != nil {
		err = b.readErr(ctx, spec, r, sess, err)
		if isDown(err) {
			src.drop(sess)
		}
		return Document{}, err
	}
	d, err := decodeContents(spec, r, res)
	if err != nil {
		return Document{}, err
	}
	src.subscribe(ctx, sess, spec.uri(r.ID, ""))
	return d, nil
}

// decodeContents reads a resources/read answer into a document: its first
// contents, text or blob; its version is _meta.version, else a digest of
// the content (which then names exactly this content).
func decodeContents(spec *Source, r Ref, res *mcp.ReadResourceResult) (Document, error) {
	if res == nil || len(res.Contents) == 0 || res.Contents[0] == nil {
		return Document{}, protocol(spec.Name, "resources/read of %s returned no contents", r.ID)
	}
	c := res.Contents[0]
	text := c.Blob == nil
	body := c.Blob
	if text {
		body = []byte(c.Text)
	}
	if len(body) > spec.maxDocument() {
		return Document{}, api.NewError(api.ResourceExhausted, api.EDocTooLarge,
			"document %s of source %s is %d bytes, over the source's limit of %d", r.ID, spec.Name, len(body), spec.maxDocument()).
			WithDetail("not_started", true)
	}
	version, _ := c.Meta["version"].(string)
	if version == "" {
		sum := sha256.Sum256(body)
		version = "sha256-" + hex.EncodeToString(sum[:8])
	}
	if r.Version != "" && version != r.Version {
		return Document{}, api.NewError(api.DocumentVersionConflict, api.EDocVersionConflict,
			"document %s of source %s: version %s is not served (the source has %s)", r.ID, spec.Name, r.Version, version).
			WithDetail("not_started", true).WithDetail("document_id", r.ID).WithDetail("version", r.Version)
	}
	d := Document{DocumentID: r.ID, Version: version, Source: spec.Name, MIMEType: c.MIMEType, bytes: len(body)}
	setContent(&d, body, text)
	return d, nil
}

// readErr says why a read failed: the request's time ran out (E3605), the
// document or version does not exist (E3601, E3604), the server refused
// otherwise (E3606), or it is gone (E3602).
func (b *Bridge) readErr(ctx context.Context, spec *Source, r Ref, sess interface{ Done() <-chan struct{} }, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return api.NewError(api.Timeout, api.EDocTimeout, "document source %s did not answer for %s within %v",
			spec.Name, r.ID, spec.timeout()).AsRetryable().WithDetail("not_started", true).WithDetail("source", spec.Name)
	}
	var rpc *jsonrpc.Error
	// -32003 to -32005 are the SDK's own: a closing client or server, or
	// a request the transport could not deliver (the server is gone).
	if errors.As(err, &rpc) && (rpc.Code > -32003 || rpc.Code < -32005) {
		if rpc.Code == -32002 || rpc.Code == jsonrpc.CodeInvalidParams && strings.Contains(strings.ToLower(rpc.Message), "not found") {
			if r.Version != "" {
				return api.NewError(api.DocumentVersionConflict, api.EDocVersionConflict,
					"document %s of source %s: version %s is no longer served", r.ID, spec.Name, r.Version).
					WithDetail("not_started", true).WithDetail("document_id", r.ID).WithDetail("version", r.Version)
			}
			return notFound(fmt.Sprintf("document %s does not exist at source %s", r.ID, spec.Name))
		}
		return protocol(spec.Name, "reading %s: %s", r.ID, rpc.Message)
	}
	select {
	case <-sess.Done():
		return unavailable(spec.Name, "it went away while reading %s", r.ID)
	default:
	}
	if errors.Is(err, mcp.ErrConnectionClosed) {
		return unavailable(spec.Name, "the connection closed while reading %s", r.ID)
	}
	return unavailable(spec.Name, "reading %s: %v", r.ID, err)
}

// search runs the query on every source that maps search_documents, and
// returns what it found, at most MaxSearchResults.
func (b *Bridge) search(ctx context.Context, query string, names []string) ([]Ref, error) {
	var out []Ref
	for _, n := range names {
		src := b.source(n)
		if src == nil || src.spec.SearchTool == "" {
			continue
		}
		found, err := b.searchOne(ctx, src, query)
		if err != nil {
			return nil, err
		}
		out = append(out, found...)
		if len(out) >= MaxSearchResults {
			return out[:MaxSearchResults], nil
		}
	}
	return out, nil
}

func (b *Bridge) searchOne(ctx context.Context, src *source, query string) ([]Ref, error) {
	spec := src.spec
	ctx, cancel := context.WithTimeout(ctx, spec.timeout())
	defer cancel()
	sess, err := b.session(ctx, src)
	if err != nil {
		return nil, err
	}
	res, err := sess.Client().CallTool(ctx, &mcp.CallToolParams{Name: spec.SearchTool,
		Arguments: map[string]any{"query": query, "limit": MaxSearchResults}})
	if err != nil {
		err = b.readErr(ctx, spec, Ref{ID: "search " + spec.SearchTool}, sess, err)
		if isDown(err) {
			src.drop(sess)
		}
		return nil, err
	}
	if res.IsError {
		return nil, protocol(spec.Name, "search tool %s failed", spec.SearchTool)
	}
	ids, err := SearchResult(res.StructuredContent)
	if err != nil {
		return nil, protocol(spec.Name, "search tool %s: %v", spec.SearchTool, err)
	}
	refs := make([]Ref, 0, len(ids))
	for _, id := range ids {
		refs = append(refs, Ref{Source: spec.Name, ID: id})
	}
	return refs, nil
}

// SearchResult reads the ids of a search tool's structured result,
// {"documents": [{"id": "..."}]}.
func SearchResult(v any) ([]string, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var r struct {
		Documents []struct {
			ID string `json:"id"`
		} `json:"documents"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || r.Documents == nil {
		return nil, errors.New(`the structured result is not {"documents": [{"id": ...}]}`)
	}
	var ids []string
	for _, d := range r.Documents {
		if d.ID == "" || len(d.ID) > 512 {
			return nil, errors.New("a document id is empty or too long")
		}
		ids = append(ids, d.ID)
	}
	return ids, nil
}

func notFound(msg string) *api.Error {
	return api.NewError(api.DocumentNotFound, api.EDocNotFound, "%s", msg).WithDetail("not_started", true)
}

func protocol(source, format string, args ...any) *api.Error {
	return api.NewError(api.ExternalAPIError, api.EDocProtocol, "document source %s answered wrongly: "+format,
		append([]any{source}, args...)...).WithDetail("not_started", true).WithDetail("source", source)
}
