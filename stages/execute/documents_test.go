package execute

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages/execute/builtin"
)

// pinningDocs hands one document at the pinned version, or v<latest>
// when nothing is pinned, and records the pins it was given.
type pinningDocs struct {
	latest string
	got    [][]api.DocumentPin
}

func (d *pinningDocs) Resolve(_ context.Context, inv *envelope.Invocation, m *tools.Manifest, pins []api.DocumentPin) (DocumentHandoff, error) {
	d.got = append(d.got, pins)
	v := d.latest
	if len(pins) > 0 {
		v = pins[0].Version
	}
	params, _ := json.Marshal(map[string]any{m.Documents.Parameter: []map[string]string{{"document_id": "guide", "version": v}}})
	h := DocumentHandoff{Params: params, Accessed: []api.DocumentAccess{{DocumentID: "guide", Version: v, Source: "h", Bytes: 3}}}
	if inv.Request.DocumentContext.VersionPinning {
		h.Pins = []api.DocumentPin{{Source: "h", DocumentID: "guide", Version: v}}
	}
	return h, nil
}

// TestDocumentPins: pins resolved at a call's start are stored in its
// record; a redelivered run is held to them; pins the invocation already
// carries (a resumed run) come first; the request's own parameters, which
// audit events carry, never hold the documents.
func TestDocumentPins(t *testing.T) {
	reg := tools.NewRegistry()
	reg.Put(&tools.Manifest{ID: "reader", Version: "1.0.0", Kind: "builtin", Builtin: &tools.BuiltinConfig{Function: "echo"},
		Safety: tools.Safety{Idempotent: true}, Documents: &tools.Documents{Parameter: "docs"}})
	reg.Put(&tools.Manifest{ID: "plain", Version: "1.0.0", Kind: "builtin", Builtin: &tools.BuiltinConfig{Function: "echo"}})
	echo := builtin.Set{"echo": func(_ context.Context, p json.RawMessage) (json.RawMessage, error) { return p, nil }}
	st := newFakeStore()
	docs := &pinningDocs{latest: "v1"}
	x := &Executor{reg: reg, builtins: echo, store: st, running: NewRunning(), Documents: docs}
	run := func(tool string, pins []api.DocumentPin) (*envelope.Invocation, error) {
		req := &api.Request{ToolID: tool, Parameters: json.RawMessage(`{"q":1}`),
			DocumentContext: &api.DocumentContext{DocumentRefs: []string{"guide"}, VersionPinning: true}}
		inv := &envelope.Invocation{ID: "i-1", Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: 5},
			Request: req, Route: &envelope.Route{ToolID: tool, ToolVersion: "1.0.0", Executor: "builtin"}, DocumentPins: pins}
		_, err := x.Process(context.Background(), inv)
		return inv, err
	}
	inv, err := run("reader", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []api.DocumentPin{{Source: "h", DocumentID: "guide", Version: "v1"}}
	if !slices.Equal(st.records["i-1"].DocumentPins, want) || !slices.Equal(inv.DocumentPins, want) {
		t.Fatalf("pins: record %+v, invocation %+v", st.records["i-1"].DocumentPins, inv.DocumentPins)
	}
	if string(inv.Request.Parameters) != `{"q":1}` || len(inv.Metadata.DocumentsAccessed) != 1 {
		t.Fatalf("request parameters %s, accessed %+v", inv.Request.Parameters, inv.Metadata.DocumentsAccessed)
	}
	// The worker died mid-run: the redelivery reads v1, though v2 is out.
	docs.latest = "v2"
	inv, err = run("reader", nil)
	if err != nil || docs.got[1] == nil || docs.got[1][0].Version != "v1" || string(inv.Result) != `{"docs":[{"document_id":"guide","version":"v1"}]}` {
		t.Fatalf("redelivered: %s %v, pins given %+v", inv.Result, err, docs.got)
	}
	// A resumed run sets the pins it was checkpointed with.
	delete(st.records, "i-1")
	resumed := []api.DocumentPin{{Source: "h", DocumentID: "guide", Version: "v0"}}
	if _, err = run("reader", resumed); err != nil || docs.got[2][0].Version != "v0" {
		t.Fatalf("resumed: %v, pins given %+v", err, docs.got[2])
	}
	delete(st.records, "i-1")
	_, err = run("plain", nil)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.ECode != api.ERequestInvalid {
		t.Fatalf("a tool without documents: %v", err)
	}
	delete(st.records, "i-1")
	x.Documents = nil
	_, err = run("reader", nil)
	if !errors.As(err, &ae) || ae.ECode != api.EDocUnavailable {
		t.Fatalf("no bridge: %v", err)
	}
}
