package execute

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages/execute/builtin"
	"github.com/toolgate/toolgate/stages/execute/kind"
)

// TestBuiltinCheckpointKinds: a builtin saves micro checkpoints through
// the progress API, spaced by the request's interval (one offered within
// it waits, and is written when the call fails), and macro and named ones
// at once; each names the one before as its parent, and the call's
// metadata lists them all.
func TestBuiltinCheckpointKinds(t *testing.T) {
	reg := tools.NewRegistry()
	reg.Put(&tools.Manifest{ID: "kinds", Version: "1.0.0", Kind: "builtin", Builtin: &tools.BuiltinConfig{Function: "kinds"}})
	builtins := builtin.Set{"kinds": func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		p := kind.ProgressFrom(ctx)
		for _, step := range []func() error{
			func() error { return p.Checkpoint(json.RawMessage(`{"a":1}`)) },
			func() error { return p.Checkpoint(json.RawMessage(`{"a":2}`)) }, // within the interval: waits
			func() error {
				_, err := kind.SaveCheckpoint(ctx, api.CheckpointMacro, "half", json.RawMessage(`{"a":3}`))
				return err
			},
			func() error {
				_, err := kind.SaveCheckpoint(ctx, api.CheckpointNamed, "keep", json.RawMessage(`{"a":4}`))
				return err
			},
		} {
			if err := step(); err != nil {
				return nil, err
			}
		}
		return nil, errors.New("gave up")
	}}
	st := newFakeStore()
	x := &Executor{reg: reg, builtins: builtins, store: st, running: NewRunning()}
	inv := &envelope.Invocation{ID: "i-1", Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: 5},
		Request: &api.Request{ToolID: "kinds", Parameters: json.RawMessage(`{}`),
			CheckpointConfig: &api.CheckpointConfig{CheckpointIntervalSeconds: 60}},
		Route: &envelope.Route{ToolID: "kinds", ToolVersion: "1.0.0", Executor: "builtin"}}
	if _, err := x.Process(context.Background(), inv); err == nil {
		t.Fatal("the call did not fail")
	}
	var got []string
	for _, c := range st.saved {
		got = append(got, fmt.Sprintf("%s %s %s<-%s %s", c.meta.ID, c.meta.Kind, c.meta.Name, c.meta.Parent, c.state))
	}
	want := []string{
		`cp-1-i-1 micro <- {"a":1}`,
		`cp-2-i-1 macro half<-cp-1-i-1 {"a":3}`,
		`cp-3-i-1 named keep<-cp-2-i-1 {"a":4}`,
		`cp-4-i-1 micro <-cp-1-i-1 {"a":2}`,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("saved\n%q\nwant\n%q", got, want)
	}
	if md := inv.Metadata.CheckpointsCreated; len(md) != 4 || md[3].ID != "cp-4-i-1" || md[3].Kind != api.CheckpointMicro {
		t.Fatalf("checkpoints_created %+v", md)
	}
}

// TestCheckpointingDisabled: with enable_checkpointing false the tool's
// micro checkpoints are ignored; the named one it saves deliberately is
// kept.
func TestCheckpointingDisabled(t *testing.T) {
	reg := tools.NewRegistry()
	reg.Put(&tools.Manifest{ID: "kinds", Version: "1.0.0", Kind: "builtin", Builtin: &tools.BuiltinConfig{Function: "kinds"}})
	builtins := builtin.Set{"kinds": func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		if err := kind.ProgressFrom(ctx).Checkpoint(json.RawMessage(`{"a":1}`)); err != nil {
			return nil, err
		}
		if _, err := kind.SaveCheckpoint(ctx, api.CheckpointNamed, "keep", json.RawMessage(`{"a":2}`)); err != nil {
			return nil, err
		}
		return json.RawMessage(`{}`), nil
	}}
	st := newFakeStore()
	x := &Executor{reg: reg, builtins: builtins, store: st, running: NewRunning()}
	off := false
	inv := &envelope.Invocation{ID: "i-1", Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: 5},
		Request: &api.Request{ToolID: "kinds", Parameters: json.RawMessage(`{}`),
			CheckpointConfig: &api.CheckpointConfig{EnableCheckpointing: &off}},
		Route: &envelope.Route{ToolID: "kinds", ToolVersion: "1.0.0", Executor: "builtin"}}
	if _, err := x.Process(context.Background(), inv); err != nil {
		t.Fatal(err)
	}
	if len(st.saved) != 1 || st.saved[0].meta.Kind != api.CheckpointNamed || len(inv.Metadata.CheckpointsCreated) != 1 {
		t.Fatalf("saved %+v", st.saved)
	}
}

// TestCheckpointKeepsDocumentPins: a checkpoint keeps the document versions
// its call was pinned to, and a new call resumed from it is held to them.
func TestCheckpointKeepsDocumentPins(t *testing.T) {
	reg := tools.NewRegistry()
	reg.Put(&tools.Manifest{ID: "keeps", Version: "1.0.0", Kind: "builtin", Builtin: &tools.BuiltinConfig{Function: "keeps"}})
	builtins := builtin.Set{"keeps": func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		if _, err := kind.SaveCheckpoint(ctx, api.CheckpointNamed, "keep", json.RawMessage(`{"a":1}`)); err != nil {
			return nil, err
		}
		return json.RawMessage(`{}`), nil
	}}
	st := newFakeStore()
	x := &Executor{reg: reg, builtins: builtins, store: st, running: NewRunning()}
	pins := []api.DocumentPin{{Source: "handbook", DocumentID: "guide", Version: "v7"}}
	call := func(id string, pins []api.DocumentPin, cc *api.CheckpointConfig) *envelope.Invocation {
		return &envelope.Invocation{ID: id, Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: 5},
			Request: &api.Request{ToolID: "keeps", Parameters: json.RawMessage(`{}`), CheckpointConfig: cc},
			Route:   &envelope.Route{ToolID: "keeps", ToolVersion: "1.0.0", Executor: "builtin"}, DocumentPins: pins}
	}
	if _, err := x.Process(context.Background(), call("i-1", pins, nil)); err != nil {
		t.Fatal(err)
	}
	if len(st.saved) != 1 || !strings.Contains(string(st.saved[0].meta.DocumentPins), `"v7"`) {
		t.Fatalf("saved %+v, want the call's pins kept", st.saved)
	}
	resumed := call("i-2", nil, &api.CheckpointConfig{ResumeFromCheckpointID: st.saved[0].meta.ID})
	if _, err := x.Process(context.Background(), resumed); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(resumed.DocumentPins, pins) {
		t.Fatalf("resumed call pinned to %+v, want %+v", resumed.DocumentPins, pins)
	}
}
