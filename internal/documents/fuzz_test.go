package documents

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzParseRef: any reference parses to a declared source and a non-empty
// id, or is refused; a parsed ref written back parses the same.
func FuzzParseRef(f *testing.F) {
	for _, s := range []string{"guide", "handbook:guide@v2", "docs://a@b/c", "x@", "@v1", "other:doc", "a\x00b"} {
		f.Add(s)
	}
	names := []string{"handbook", "wiki"}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRef(s, names)
		if err != nil {
			return
		}
		if r.ID == "" || (r.Source != "handbook" && r.Source != "wiki") || strings.ContainsAny(r.Version, "/:") {
			t.Fatalf("%q parsed to %+v", s, r)
		}
		back := r.Source + ":" + r.ID
		if r.Version != "" {
			back += "@" + r.Version
		}
		again, err := ParseRef(back, names)
		if err == nil && again != r && !strings.Contains(r.ID, "@") {
			t.Fatalf("%q: %+v, written back %q: %+v", s, r, back, again)
		}
	})
}

// FuzzDecodeSource: a source document either decodes to a checked source
// or is refused, never a panic.
func FuzzDecodeSource(f *testing.F) {
	f.Add([]byte(`{"name":"h","url":"http://127.0.0.1:1/","resource_uri":"docs://{id}"}`))
	f.Add([]byte(`{"name":"h","command":["/bin/x"],"read_only_paths":["/proc"]}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		s, err := Decode(doc)
		if err == nil && (s.Name == "" || (len(s.Command) == 0) == (s.URL == "")) {
			t.Fatalf("accepted %s", doc)
		}
	})
}

// FuzzSearchResult: a search tool's answer gives non-empty ids or an error.
func FuzzSearchResult(f *testing.F) {
	f.Add([]byte(`{"documents":[{"id":"a"}]}`))
	f.Add([]byte(`{"documents":null}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var v any
		if json.Unmarshal(raw, &v) != nil {
			return
		}
		ids, err := SearchResult(v)
		for _, id := range ids {
			if err == nil && id == "" {
				t.Fatal("empty id accepted")
			}
		}
	})
}

// FuzzDecodeBatch: a fetch tool's answer decodes to documents with an id,
// a version and content, or is refused.
func FuzzDecodeBatch(f *testing.F) {
	f.Add([]byte(`{"documents":[{"id":"a","version":"v1","content":"x"}]}`))
	f.Add([]byte(`{"documents":[{"id":"a","version":"v1"}]}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var v any
		if json.Unmarshal(raw, &v) != nil {
			return
		}
		b, err := DecodeBatch(v)
		if err != nil {
			return
		}
		for _, d := range b.Documents {
			if d.ID == "" || d.Version == "" || (d.Content == nil && d.ContentBase64 == nil) {
				t.Fatalf("accepted %+v", d)
			}
		}
	})
}
