package documents_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/documents"
	"github.com/toolgate/toolgate/internal/documents/doctest"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/kvstore"
)

// BenchmarkDocumentFetch: resolving one 8 KiB document of a call's
// document_context, cold (policy, resources/read over streamable HTTP from
// a loopback source, two cache writes) and cached (policy, one KV get),
// beside a bare KV get of the same entry.
func BenchmarkDocumentFetch(b *testing.B) {
	_, js := natstest.JetStream(b)
	st, err := kvstore.Open(context.Background(), js, kvstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	srv := doctest.Start(map[string]string{"doc": strings.Repeat("policy text ", 8<<10/12)})
	b.Cleanup(srv.Stop)
	br, err := documents.New(documents.Config{Store: st})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(br.Close)
	src, err := documents.Decode([]byte(srv.Source("handbook")))
	if err != nil {
		b.Fatal(err)
	}
	br.Apply("handbook", src)
	inv := &envelope.Invocation{Tenant: "acme", Request: &api.Request{Parameters: json.RawMessage(`{}`),
		DocumentContext: &api.DocumentContext{DocumentRefs: []string{"doc"}}}}
	ctx := context.Background()
	resolve := func(b *testing.B, cached bool) {
		h, err := br.Resolve(ctx, inv, manifest, nil)
		if err != nil || h.Accessed[0].Cached != cached {
			b.Fatalf("%+v %v", h.Accessed, err)
		}
	}
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			if err := st.DropCachedDoc(ctx, "handbook", "doc"); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			resolve(b, false)
		}
	})
	b.Run("cached", func(b *testing.B) {
		if _, err := br.Resolve(ctx, inv, manifest, nil); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			resolve(b, true)
		}
	})
	b.Run("bare-kv-get", func(b *testing.B) {
		for b.Loop() {
			if _, ok, err := st.CachedDoc(ctx, "handbook", "doc", ""); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
	})
}
