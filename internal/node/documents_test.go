package node_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/documents/doctest"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages/execute/mcptool/mcptest"
	"github.com/toolgate/toolgate/subjects"
)

const docsTool = `{"id":"test.docs","name":"read docs","version":"1.0.0","description":"returns the documents it was handed",
  "kind":"builtin","builtin":{"function":"read_docs"},"documents":{"parameter":"docs"},
  "input_schema":{"type":"object"},"output_schema":{"type":"object"}}`

func docsRequest(tenant string, dc api.DocumentContext) api.Request {
	req := request(tenant, "test.docs", `{"question":"which door"}`)
	req.DocumentContext = &dc
	return req
}

// handed is what test.docs saw: the documents in its docs parameter.
func handed(t *testing.T, resp api.Response) []map[string]any {
	t.Helper()
	if resp.Status != api.StatusSuccess {
		t.Fatalf("%s %s", resp.Status, mustJSON(t, resp.Error))
	}
	var out struct {
		Docs []map[string]any `json:"docs"`
	}
	if err := json.Unmarshal(resp.Result, &out); err != nil {
		t.Fatal(err)
	}
	return out.Docs
}

func accessed(t *testing.T, resp api.Response) api.DocumentAccess {
	t.Helper()
	if resp.ExecutionMetadata == nil || len(resp.ExecutionMetadata.DocumentsAccessed) != 1 {
		t.Fatalf("documents_accessed: %s", mustJSON(t, resp.ExecutionMetadata))
	}
	return resp.ExecutionMetadata.DocumentsAccessed[0]
}

// TestDocumentsEndToEnd: a source declared through the control endpoint
// serves a call's document_context through the whole pipeline: fetched,
// pinned, listed in documents_accessed and in the audit trail (never the
// content), refused by the pushed document policy, invalidated when the
// source announces a change, and served from KV with the source stopped.
func TestDocumentsEndToEnd(t *testing.T) {
	const tenant = "docs"
	srv := doctest.Start(map[string]string{"guide": "use the side door", "plan": "the plan"})
	t.Cleanup(srv.Stop)
	e := newEnv(t, topology.TopologyOptions{})
	cfg := node.Config{}
	cfg.Stage.Builtins = e.builtins(t.TempDir())
	cfg.Stage.Builtins["read_docs"] = func(_ context.Context, p json.RawMessage) (json.RawMessage, error) {
		var in struct {
			Docs json.RawMessage `json:"docs"`
		}
		if err := json.Unmarshal(p, &in); err != nil {
			return nil, err
		}
		return json.Marshal(map[string]any{"docs": in.Docs})
	}
	n := e.startPipeline(cfg)
	registerTools(t, n, docsTool)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.client.AddDocSource(ctx, json.RawMessage(srv.Source("handbook")), "ops"); err != nil {
		t.Fatal(err)
	}
	srcs, err := e.client.DocSources(ctx)
	if err != nil || len(srcs) != 1 || !strings.Contains(string(srcs[0]), `"handbook"`) {
		t.Fatalf("docs source list: %s %v", srcs, err)
	}

	// Fetched and pinned. The workers learn of the source by watching.
	var resp api.Response
	eventually(t, 10*time.Second, "the source reaches the workers", func() bool {
		resp = e.invoke(docsRequest(tenant, api.DocumentContext{DocumentRefs: []string{"guide"}, VersionPinning: true}))
		return resp.Status == api.StatusSuccess
	})
	docs := handed(t, resp)
	if len(docs) != 1 || docs[0]["content"] != "use the side door" || docs[0]["version"] != "v1" {
		t.Fatalf("handed %v", docs)
	}
	if a := accessed(t, resp); a.DocumentID != "guide" || a.Version != "v1" || a.Source != "handbook" || a.Bytes != len("use the side door") {
		t.Fatalf("accessed %+v", a)
	}
	rec, err := n.Store.Status(ctx, tenant, resp.InvocationID)
	if err != nil || len(rec.DocumentPins) != 1 || rec.DocumentPins[0].Version != "v1" {
		t.Fatalf("pins in the record: %+v %v", rec.DocumentPins, err)
	}
	// The audit trail names the document and its version, never its content.
	var found bool
	for _, ev := range e.auditOf(tenant, e.count(subjects.StreamAudit, subjects.AuditTenant(tenant))) {
		data := string(ev.Data())
		if strings.Contains(data, "side door") {
			t.Fatalf("audit event %s carries the document's content: %s", ev.Type(), data)
		}
		if ev.Type() == "ai.agent.tool.succeeded" && strings.Contains(data, `"document_id":"guide"`) && strings.Contains(data, `"document_version":"v1"`) {
			found = true
		}
	}
	if !found {
		t.Fatal("no tool.succeeded audit event lists the document read")
	}

	// A query hands what the source's search finds.
	resp = e.invoke(docsRequest(tenant, api.DocumentContext{Query: "side door"}))
	if a := accessed(t, resp); a.DocumentID != "guide" || !a.Cached {
		t.Fatalf("query: %+v", a)
	}

	// Refused by the pushed document policy.
	own := `package toolgate.documents
decision := {"allow": false, "reasons": ["plans are for humans"]} if input.document_id == "plan"
decision := {"allow": true} if input.document_id != "plan"
`
	if _, err := e.client.PushPolicy(ctx, map[string]string{"authz.rego": policy.DefaultModule(), "docs.rego": own}, nil, "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the document policy refuses plan", func() bool {
		resp = e.invoke(docsRequest(tenant, api.DocumentContext{DocumentRefs: []string{"plan"}}))
		return resp.Status == api.StatusPermissionDenied
	})
	wantError(t, resp, api.StatusPermissionDenied, api.EDocDenied)

	// A change the source announces drops the cached copy: the next call
	// reads the new version.
	eventually(t, 10*time.Second, "a subscription", func() bool { return srv.Subscribers("docs://guide") > 0 })
	v2 := srv.Update("guide", "use the front door")
	eventually(t, 10*time.Second, "the new version", func() bool {
		resp = e.invoke(docsRequest(tenant, api.DocumentContext{DocumentRefs: []string{"guide"}}))
		return resp.Status == api.StatusSuccess && accessed(t, resp).Version == v2
	})
	if docs := handed(t, resp); docs[0]["content"] != "use the front door" {
		t.Fatalf("after the update: %v", docs)
	}

	// With the source stopped the cached copy serves.
	reads := srv.Reads.Load()
	srv.Stop()
	resp = e.invoke(docsRequest(tenant, api.DocumentContext{DocumentRefs: []string{"guide"}}))
	if a := accessed(t, resp); !a.Cached || a.Version != v2 || handed(t, resp)[0]["content"] != "use the front door" {
		t.Fatalf("with the source stopped: %+v", a)
	}
	if srv.Reads.Load() != reads {
		t.Fatal("the stopped source was read")
	}
	// A document never fetched cannot be served: E3602.
	resp = e.invoke(docsRequest(tenant, api.DocumentContext{DocumentRefs: []string{"guide@v1", "other"}}))
	wantError(t, resp, api.StatusError, api.EDocUnavailable)
}

// TestDocumentsEverything: the reference server-everything, started in the
// sandbox over stdio as a document source, serves its documentation files;
// a second call is served from KV, and a pin on the content digest holds.
func TestDocumentsEverything(t *testing.T) {
	script, modules := mcptest.Everything(t)
	e, n := mcpPipeline(t, t.TempDir())
	src, err := json.Marshal(map[string]any{"name": "everything", "command": []string{"node", script, "stdio"},
		"read_only_paths": []string{modules}, "resource_uri": "demo://resource/static/document/{id}"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.client.AddDocSource(ctx, src, "ops"); err != nil {
		t.Fatal(err)
	}
	tool := strings.Replace(docsTool, `"builtin":{"function":"read_docs"}`, `"builtin":{"function":"echo"}`, 1)
	registerTools(t, n, tool)
	var resp api.Response
	eventually(t, 30*time.Second, "the source reaches the workers", func() bool {
		resp = e.invoke(docsRequest("ev", api.DocumentContext{DocumentRefs: []string{"features.md"}, VersionPinning: true}))
		return resp.Status == api.StatusSuccess
	})
	first := accessed(t, resp)
	docs := handed(t, resp)
	if first.Cached || !strings.HasPrefix(first.Version, "sha256-") || first.Bytes < 100 ||
		!strings.Contains(docs[0]["content"].(string), "#") || docs[0]["mime_type"] != "text/markdown" {
		t.Fatalf("first read: %+v %v", first, docs[0]["mime_type"])
	}
	resp = e.invoke(docsRequest("ev", api.DocumentContext{DocumentRefs: []string{"everything:features.md@" + first.Version}}))
	if a := accessed(t, resp); !a.Cached || a.Version != first.Version || a.Bytes != first.Bytes {
		t.Fatalf("second read: %+v", a)
	}
	resp = e.invoke(docsRequest("ev", api.DocumentContext{DocumentRefs: []string{"no-such-file.md"}}))
	wantError(t, resp, api.StatusError, api.EDocNotFound)
}

// docSourcesSigned, on an authenticated bus: a source an operator added
// (signed) serves calls; one written straight into the bucket with
// control's credentials is audited as refused by execute and serves
// nothing; remove ends the signed one.
func docSourcesSigned(t *testing.T, ctx context.Context, s *served, op, agent *client.Client, token string) {
	srv := doctest.Start(map[string]string{"guide": "use the side door"})
	t.Cleanup(srv.Stop)
	if _, err := op.RegisterTool(ctx, []byte(strings.Replace(docsTool, `"builtin":{"function":"read_docs"}`, `"builtin":{"function":"echo"}`, 1)), false); err != nil {
		t.Fatal(err)
	}
	call := func(ref string) api.Response {
		t.Helper()
		req := api.Request{ToolID: "test.docs", Parameters: json.RawMessage(`{}`), CapabilityToken: token,
			AgentContext:    api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"},
			DocumentContext: &api.DocumentContext{DocumentRefs: []string{ref}}}
		id, err := agent.Invoke(ctx, req, client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := agent.Wait(ctx, "demo", id)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if _, err := op.AddDocSource(ctx, json.RawMessage(srv.Source("signed")), "mallory"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the signed source serves", func() bool {
		return call("signed:guide").Status == api.StatusSuccess
	})
	cjs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleControl)))
	cs, err := kvstore.Open(ctx, cjs, kvstore.Options{Bind: true, Buckets: busauth.Rights[busauth.RoleControl].Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := cs.PutDocSource(ctx, "forged", json.RawMessage(srv.Source("forged")), "operator:local", nil)
	if err != nil {
		t.Fatal(err)
	}
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	stateRefused(t, ctx, ojs, "document source", rev, "urn:toolgate:execute")
	if r := call("forged:guide"); r.Error == nil || r.Error.ECode != api.EDocNotFound {
		t.Fatalf("a call naming the unsigned source: %s %s", r.Status, mustJSON(t, r.Error))
	}
	if err := op.RemoveDocSource(ctx, "signed", "mallory"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the removed source serves nothing", func() bool {
		r := call("signed:guide")
		return r.Error != nil && r.Error.ECode == api.EDocNotFound
	})
}

// TestDocumentPinFailed: a call whose pinned versions cannot be stored
// with it (the invocation bucket refuses the write: it is full) ends with
// E3608 before its tool runs, retryable, and nothing is pinned.
func TestDocumentPinFailed(t *testing.T) {
	const tenant = "pinfail"
	srv := doctest.Start(map[string]string{"guide": "use the side door", "plan": "the plan"})
	t.Cleanup(srv.Stop)
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{})
	registerTools(t, n, strings.Replace(docsTool, `"builtin":{"function":"read_docs"}`, `"builtin":{"function":"echo"}`, 1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.client.AddDocSource(ctx, json.RawMessage(srv.Source("handbook")), "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the source reaches the workers", func() bool {
		return e.invoke(docsRequest(tenant, api.DocumentContext{DocumentRefs: []string{"guide"}})).Status == api.StatusSuccess
	})

	// The read is held for a second: time to fill the bucket between the
	// call's claim and its pins.
	srv.Delay(time.Second)
	reads := srv.Reads.Load()
	id, err := e.client.Invoke(ctx, docsRequest(tenant, api.DocumentContext{DocumentRefs: []string{"plan"}, VersionPinning: true}), client.InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the document to be read", func() bool { return srv.Reads.Load() > reads })
	bucket, err := e.js.Stream(ctx, "KV_"+subjects.BucketInvocations)
	if err != nil {
		t.Fatal(err)
	}
	info, err := bucket.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	limit := func(max int64) {
		t.Helper()
		cfg := info.Config
		cfg.MaxBytes = max
		if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	limit(int64(info.State.Bytes)) // full: a larger record is refused
	// Audit cannot end the call while the bucket is full: the ending waits
	// in the pipeline until there is room again.
	eventually(t, 10*time.Second, "execute to end the call", func() bool {
		return e.count(subjects.StreamPipeline, subjects.PipeStage(subjects.Audit)) > 0
	})
	limit(info.Config.MaxBytes)
	resp, err := e.client.Wait(ctx, tenant, id)
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, resp, api.StatusError, api.EDocPinFailed)
	if !resp.Error.Retryable || resp.Error.Details["not_started"] != true {
		t.Fatalf("pin failure: %s", mustJSON(t, resp.Error))
	}
	rec, err := n.Store.Status(ctx, tenant, id)
	if err != nil || len(rec.DocumentPins) != 0 {
		t.Fatalf("record after the pin failure: %s, %v", mustJSON(t, rec), err)
	}
}
