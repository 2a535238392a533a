package signedstate

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

func TestDocSource(t *testing.T) {
	src := json.RawMessage(`{"name":"handbook","url":"http://127.0.0.1:9/mcp"}`)
	body, _ := json.Marshal(api.DocSourceRequest{Source: src})
	signed := &api.DecisionProof{Subject: subjects.SvcDocsSourceAdd, Body: body}
	alice := func(*api.DecisionProof) (string, error) { return "operator:alice", nil }
	forged := func(*api.DecisionProof) (string, error) { return "", errors.New("bad signature") }
	rec := func(doc string, by string, p *api.DecisionProof) kvstore.DocSourceRecord {
		return kvstore.DocSourceRecord{Name: "handbook", Source: json.RawMessage(doc), By: by, Proof: p}
	}
	cases := []struct {
		name   string
		r      kvstore.DocSourceRecord
		key    string
		verify Verify
		ok     bool
	}{
		{"signed by the operator it names", rec(string(src), "operator:alice", signed), "handbook", alice, true},
		{"same document, other spacing", rec(`{"url": "http://127.0.0.1:9/mcp", "name": "handbook"}`, "operator:alice", signed), "handbook", alice, true},
		{"unsigned", rec(string(src), "operator:alice", nil), "handbook", alice, false},
		{"a signature that does not verify", rec(string(src), "operator:alice", signed), "handbook", forged, false},
		{"another operator's", rec(string(src), "operator:bob", signed), "handbook", alice, false},
		{"another server", rec(`{"name":"handbook","url":"http://evil.example/mcp"}`, "operator:alice", signed), "handbook", alice, false},
		{"under another name", rec(string(src), "operator:alice", signed), "wiki", alice, false},
		{"a signed request to another endpoint", rec(string(src), "operator:alice",
			&api.DecisionProof{Subject: subjects.SvcModelsRegister, Body: body}), "handbook", alice, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := DocSource(c.r, c.key, c.verify); (err == nil) != c.ok {
				t.Fatalf("DocSource: %v, want ok=%v", err, c.ok)
			}
		})
	}
}
