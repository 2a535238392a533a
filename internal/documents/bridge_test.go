package documents_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/documents"
	"github.com/toolgate/toolgate/internal/documents/doctest"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

type fixture struct {
	nc    *nats.Conn
	store *kvstore.Store
	srv   *doctest.Server
	b     *documents.Bridge
	now   atomic.Pointer[time.Time]
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	nc, js := natstest.JetStream(t)
	st, err := kvstore.Open(context.Background(), js, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{nc: nc, store: st}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.now.Store(&start)
	f.srv = doctest.Start(map[string]string{"guide": "# Guide\nuse the side door", "plan": "the plan, secret"})
	t.Cleanup(f.srv.Stop)
	f.b, err = documents.New(documents.Config{Store: st, Now: func() time.Time { return *f.now.Load() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.b.Close)
	src, err := documents.Decode([]byte(f.srv.Source("handbook")))
	if err != nil {
		t.Fatal(err)
	}
	f.b.Apply("handbook", src)
	return f
}

func (f *fixture) advance(d time.Duration) {
	n := f.now.Load().Add(d)
	f.now.Store(&n)
}

var manifest = &tools.Manifest{ID: "reader", Version: "1.0.0", Documents: &tools.Documents{Parameter: "docs"}}

func (f *fixture) resolve(t *testing.T, dc api.DocumentContext, pins ...api.DocumentPin) ([]documents.Document, error) {
	t.Helper()
	inv := &envelope.Invocation{ID: "i1", Tenant: "acme", Request: &api.Request{ToolID: "reader",
		AgentContext: api.AgentContext{AgentDID: "did:agent:a", TenantID: "acme"},
		Parameters:   json.RawMessage(`{"question":"where"}`), DocumentContext: &dc}}
	h, err := f.b.Resolve(context.Background(), inv, manifest, pins)
	if err != nil {
		return nil, err
	}
	var p struct {
		Question string               `json:"question"`
		Docs     []documents.Document `json:"docs"`
	}
	if err := json.Unmarshal(h.Params, &p); err != nil || p.Question != "where" {
		t.Fatalf("handed parameters %s: %v", h.Params, err)
	}
	if len(h.Accessed) != len(p.Docs) {
		t.Fatalf("accessed %+v for %d documents", h.Accessed, len(p.Docs))
	}
	for i, a := range h.Accessed {
		if a.DocumentID != p.Docs[i].DocumentID || a.Version != p.Docs[i].Version || a.Bytes != len(p.Docs[i].Content) || a.Source != "handbook" {
			t.Fatalf("accessed %+v for document %+v", a, p.Docs[i])
		}
	}
	if dc.VersionPinning && len(h.Pins) != len(p.Docs) {
		t.Fatalf("pins %+v", h.Pins)
	}
	return p.Docs, nil
}

func wantCode(t *testing.T, err error, ecode string) *api.Error {
	t.Helper()
	var te *api.Error
	if !errors.As(err, &te) || te.ECode != ecode {
		t.Fatalf("got %v, want %s", err, ecode)
	}
	if ns, _ := te.Details["not_started"].(bool); !ns {
		t.Fatalf("%s without details.not_started", ecode)
	}
	// The document bridge specification's ToolErrorCode travels beside the
	// number.
	if want, ok := map[string]api.Code{api.EDocNotFound: api.DocumentNotFound, api.EDocUnavailable: api.DocumentUnavailable,
		api.EDocVersionConflict: api.DocumentVersionConflict}[ecode]; ok && te.Code != want {
		t.Fatalf("%s has code %s, want %s", ecode, te.Code, want)
	}
	return te
}

// TestFetchCacheInvalidate: a document is fetched once, then served from
// KV (even with the source stopped), dropped from the cache when the
// source announces a change, and read again at its new version.
func TestFetchCacheInvalidate(t *testing.T) {
	f := newFixture(t)
	docs, err := f.resolve(t, api.DocumentContext{DocumentRefs: []string{"guide"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 1 || docs[0].Version != "v1" || !strings.Contains(docs[0].Content, "side door") {
		t.Fatalf("docs %+v", docs)
	}
	if _, err := f.resolve(t, api.DocumentContext{DocumentRefs: []string{"handbook:guide"}}); err != nil {
		t.Fatal(err)
	}
	if n := f.srv.Reads.Load(); n != 1 {
		t.Fatalf("the second read reached the source: %d reads", n)
	}
	// The change is announced to the subscribed bridge, which drops its copy.
	natstest.Eventually(t, 5*time.Second, func() bool { return f.srv.Subscribers("docs://guide") > 0 }, "subscription")
	v := f.srv.Update("guide", "# Guide\nuse the front door")
	natstest.Eventually(t, 5*time.Second, func() bool {
		_, ok, _ := f.store.CachedDoc(context.Background(), "handbook", "guide", "")
		return !ok
	}, "the cached latest dropped on notifications/resources/updated")
	docs, err = f.resolve(t, api.DocumentContext{DocumentRefs: []string{"guide"}})
	if err != nil || docs[0].Version != v || !strings.Contains(docs[0].Content, "front door") {
		t.Fatalf("after the update: %+v %v", docs, err)
	}
	// Pinned versions are immutable: served from the cache with the source gone.
	f.srv.Stop()
	docs, err = f.resolve(t, api.DocumentContext{DocumentRefs: []string{"guide@v2"}})
	if err != nil || docs[0].Version != "v2" {
		t.Fatalf("cached version with the source stopped: %+v %v", docs, err)
	}
	// The hot copy expires after five minutes; with the source down the
	// expired copy stands in, with a warning.
	f.advance(6 * time.Minute)
	if _, err := f.resolve(t, api.DocumentContext{DocumentRefs: []string{"guide"}}); err != nil {
		t.Fatalf("expired copy with the source down: %v", err)
	}
	// A document never cached, with the source down, is E3602.
	_, err = f.resolve(t, api.DocumentContext{DocumentRefs: []string{"plan"}})
	wantCode(t, err, api.EDocUnavailable)
}

// TestAnnouncedUpdate: a change announced on toolgate.docs.updated.<source>
// drops the cached copy.
func TestAnnouncedUpdate(t *testing.T) {
	f := newFixture(t)
	stop, err := f.b.Listen(f.nc)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if _, err := f.resolve(t, api.DocumentContext{DocumentRefs: []string{"plan"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.nc.Request(subjects.DocsUpdated("handbook"), []byte(`{"document_id":"plan"}`), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := f.store.CachedDoc(context.Background(), "handbook", "plan", ""); ok {
		t.Fatal("the announced document is still cached")
	}
	if _, err := f.resolve(t, api.DocumentContext{DocumentRefs: []string{"plan"}}); err != nil || f.srv.Reads.Load() != 2 {
		t.Fatalf("read again: %v, %d reads", err, f.srv.Reads.Load())
	}
}

// TestFailures: every failure has its code.
func TestFailures(t *testing.T) {
	f := newFixture(t)
	_, err := f.resolve(t, api.DocumentContext{DocumentRefs: []string{"nope"}})
	wantCode(t, err, api.EDocNotFound)
	_, err = f.resolve(t, api.DocumentContext{DocumentRefs: []string{"other:guide"}})
	wantCode(t, err, api.EDocNotFound)
	_, err = f.resolve(t, api.DocumentContext{DocumentRefs: []string{"guide@v7"}})
	wantCode(t, err, api.EDocVersionConflict)
	f.srv.Update("guide", "second")
	f.srv.Remove("guide", "v1")
	_, err = f.resolve(t, api.DocumentContext{DocumentRefs: []string{"guide"}}, api.DocumentPin{Source: "handbook", DocumentID: "guide", Version: "v1"})
	wantCode(t, err, api.EDocVersionConflict)
	f.srv.Fail(true)
	_, err = f.resolve(t, api.DocumentContext{DocumentRefs: []string{"plan"}})
	wantCode(t, err, api.EDocProtocol)
	f.srv.Fail(false)
	f.srv.Delay(3 * time.Second) // over the source's 2 s request timeout
	_, err = f.resolve(t, api.DocumentContext{DocumentRefs: []string{"plan"}})
	wantCode(t, err, api.EDocTimeout)
	f.srv.Delay(0)
	small := *manifest
	small.Documents = &tools.Documents{Parameter: "docs", MaxBytes: 5}
	inv := &envelope.Invocation{Tenant: "acme", Request: &api.Request{DocumentContext: &api.DocumentContext{DocumentRefs: []string{"plan"}}}}
	_, err = f.b.Resolve(context.Background(), inv, &small, nil)
	wantCode(t, err, api.EDocTooLarge)
}

// TestPolicyAndSearch: the document policy is asked per document; a query
// adds what the source's search finds; pins hold the versions.
func TestPolicyAndSearch(t *testing.T) {
	f := newFixture(t)
	own := `package toolgate.documents
decision := {"allow": false, "reasons": ["plans are not for agents"]} if input.document_id == "plan"
decision := {"allow": true} if input.document_id != "plan"
`
	p, err := policy.NewDocuments(context.Background(), map[string]string{"docs.rego": own}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.b.SetPolicy(p)
	_, err = f.resolve(t, api.DocumentContext{DocumentRefs: []string{"guide", "plan"}})
	te := wantCode(t, err, api.EDocDenied)
	if !strings.Contains(te.Message, "plans are not for agents") || f.srv.Reads.Load() != 0 {
		t.Fatalf("denial %q after %d reads (a denial reads nothing)", te.Message, f.srv.Reads.Load())
	}
	docs, err := f.resolve(t, api.DocumentContext{Query: "side door", VersionPinning: true})
	if err != nil || len(docs) != 1 || docs[0].DocumentID != "guide" {
		t.Fatalf("search: %+v %v", docs, err)
	}
	f.srv.Update("guide", "changed, side door still")
	docs, err = f.resolve(t, api.DocumentContext{DocumentRefs: []string{"guide"}}, api.DocumentPin{Source: "handbook", DocumentID: "guide", Version: "v1"})
	if err != nil || docs[0].Version != "v1" {
		t.Fatalf("pinned: %+v %v", docs, err)
	}
}

// TestBatchedFetch: a source that maps get_source_of_truth onto a tool is
// asked once for all the documents a call needs.
func TestBatchedFetch(t *testing.T) {
	f := newFixture(t)
	doc := strings.Replace(f.srv.Source("handbook"), `"search_tool"`, `"fetch_tool":"get_documents","search_tool"`, 1)
	src, err := documents.Decode([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	f.b.Apply("handbook", src)
	f.srv.Update("guide", "second")
	docs, err := f.resolve(t, api.DocumentContext{DocumentRefs: []string{"guide", "plan", "guide@v1"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 3 || docs[0].Version != "v2" || docs[1].DocumentID != "plan" || docs[2].Content != "# Guide\nuse the side door" {
		t.Fatalf("docs %+v", docs)
	}
	// A second version of an id already in the batch is read on its own.
	if f.srv.Batches.Load() != 1 || f.srv.Reads.Load() != 1 {
		t.Fatalf("%d batched calls, %d reads; want one call and one read", f.srv.Batches.Load(), f.srv.Reads.Load())
	}
	if _, err := f.resolve(t, api.DocumentContext{DocumentRefs: []string{"guide", "plan"}}); err != nil || f.srv.Batches.Load() != 1 {
		t.Fatalf("cached: %v, %d calls", err, f.srv.Batches.Load())
	}
	_, err = f.resolve(t, api.DocumentContext{DocumentRefs: []string{"guide", "nope"}})
	wantCode(t, err, api.EDocNotFound)
	_, err = f.resolve(t, api.DocumentContext{DocumentRefs: []string{"plan@v9"}})
	wantCode(t, err, api.EDocVersionConflict)
}

// brokenCache is a document cache that cannot be reached.
type brokenCache struct{}

var errCacheDown = errors.New("cache down")

func (brokenCache) CachedDoc(context.Context, string, string, string) (kvstore.CachedDoc, bool, error) {
	return kvstore.CachedDoc{}, false, errCacheDown
}
func (brokenCache) CacheDoc(context.Context, string, string, string, kvstore.CachedDoc) error {
	return errCacheDown
}
func (brokenCache) DropCachedDoc(context.Context, string, string) error { return errCacheDown }
func (brokenCache) DropCachedSource(context.Context, string) error      { return errCacheDown }

// TestCacheUnavailable: with the cache down, documents come from their
// source and the call is warned (E3607), not failed.
func TestCacheUnavailable(t *testing.T) {
	srv := doctest.Start(map[string]string{"guide": "side door"})
	t.Cleanup(srv.Stop)
	b, err := documents.New(documents.Config{Store: brokenCache{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	src, _ := documents.Decode([]byte(srv.Source("handbook")))
	b.Apply("handbook", src)
	inv := &envelope.Invocation{Tenant: "acme", Request: &api.Request{DocumentContext: &api.DocumentContext{DocumentRefs: []string{"guide"}}}}
	h, err := b.Resolve(context.Background(), inv, manifest, nil)
	if err != nil || len(h.Accessed) != 1 || h.Accessed[0].Cached {
		t.Fatalf("%+v %v", h, err)
	}
	if len(h.Warnings) == 0 || !strings.HasPrefix(h.Warnings[0], api.EDocCacheUnavailable) {
		t.Fatalf("warnings %q", h.Warnings)
	}
}
