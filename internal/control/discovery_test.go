package control

import (
	"slices"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/tools"
)

// TestSearchPassesEveryFilter: each member of a list request reaches the
// search; a handler that dropped one would list both tools.
func TestSearchPassesEveryFilter(t *testing.T) {
	reg := tools.NewRegistry()
	for _, doc := range []string{
		`{"id":"keep","name":"keep","version":"1.0.0","description":"counts rows","kind":"builtin","builtin":{"function":"echo"},
		  "input_schema":{"type":"object"},"category":"utility","tags":["a"],"capabilities":["count_rows"]}`,
		`{"id":"drop","name":"drop","version":"1.0.0","description":"sends mail","kind":"cli","cli":{"command":["true"]},
		  "input_schema":{"type":"object"},"category":"external_api","tags":["b"],"capabilities":["send_mail"],
		  "safety":{"risk_level":"high","side_effects":["network.smtp"]},"lifecycle":{"state":"deprecated"}}`,
	} {
		m, err := tools.Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		reg.Put(m)
	}
	h := &handlers{store: &fakeStore{reg: reg}, reg: reg}
	for name, body := range map[string]string{
		"query":                `{"query":"rows"}`,
		"capabilities":         `{"capabilities":["count_rows"]}`,
		"category":             `{"category":"utility"}`,
		"tag":                  `{"tag":"a"}`,
		"risk_level_max":       `{"risk_level_max":"medium"}`,
		"exclude_side_effects": `{"exclude_side_effects":["network"]}`,
		"source_types":         `{"source_types":["builtin"]}`,
		"enabled_only":         `{"enabled_only":true}`,
	} {
		req := &fakeRequest{data: []byte(body)}
		h.search(req, "")
		l, ok := req.answer.(api.ListResponse)
		if !ok || len(l.Tools) != 1 || l.Tools[0].ToolID != "keep" || l.TotalCount != 1 {
			t.Errorf("%s: answer %+v (error %s)", name, req.answer, req.body)
		}
	}
	req := &fakeRequest{data: []byte(`{}`)}
	h.search(req, "")
	var ids []string
	for _, s := range req.answer.(api.ListResponse).Tools {
		ids = append(ids, s.ToolID)
	}
	if !slices.Equal(ids, []string{"drop", "keep"}) {
		t.Errorf("unfiltered listing %v", ids)
	}
	req = &fakeRequest{data: []byte(`{"capability_token":"x"}`)}
	if h.search(req, ""); req.ecode(t) != api.ETokenInvalid {
		t.Errorf("a token without a verifier: %s", req.body)
	}
}
