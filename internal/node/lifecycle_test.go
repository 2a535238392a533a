package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/subjects"
)

// TestToolRemovalKeepsHistory: tools delete disables a version and keeps
// its manifest, saying when and by whom; a call to it is refused with
// E3004 (not E3001) and audited; the listing hides it unless asked for
// all; the record as registered written back over the removal revives
// nothing; a new version serves again; purge, signed by an operator only,
// deletes the version for good.
func TestToolRemovalKeepsHistory(t *testing.T) {
	s := serveEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	op := s.operator(t)
	const me = "operator:local"
	const tool = "lc.gone"
	manifest := func(version string) []byte {
		return []byte(`{"id":"` + tool + `","name":"gone","version":"` + version + `","description":"a tool to remove",
		  "kind":"builtin","builtin":{"function":"noop"},"input_schema":{"type":"object"},"safety":{"risk_level":"low"}}`)
	}
	if _, err := op.RegisterTool(ctx, manifest("1.0.0"), false); err != nil {
		t.Fatal(err)
	}
	// The stages' registry learns of changes through its watch.
	if err := s.node.WaitForTool(ctx, tool, "1.0.0"); err != nil {
		t.Fatal(err)
	}
	stagesSee := func(version, state string) {
		t.Helper()
		eventually(t, 10*time.Second, "the stages to see "+tool+"@"+version+" "+state, func() bool {
			m, err := s.node.Registry.Resolve(tool, version)
			return err == nil && m.State(time.Now()) == state
		})
	}
	nc, raw := s.agent(t, 0, "demo")
	ac, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	call := func(version string) api.Response {
		t.Helper()
		id, err := ac.Invoke(ctx, api.Request{ToolID: tool, ToolVersion: version, Parameters: json.RawMessage(`{}`),
			AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}, CapabilityToken: raw}, client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := ac.Wait(ctx, "demo", id)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := call(""); r.Status != api.StatusSuccess {
		t.Fatalf("before the removal: %+v", r)
	}
	ojs, err := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	if err != nil {
		t.Fatal(err)
	}
	// The control role may write the tools bucket (its endpoints do).
	cjs, err := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleControl)))
	if err != nil {
		t.Fatal(err)
	}
	tools, err := cjs.KeyValue(ctx, "toolgate_tools")
	if err != nil {
		t.Fatal(err)
	}
	key := subjects.Token(tool) + "." + subjects.Token("1.0.0")
	registered, err := tools.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}

	doc, err := op.DeleteTool(ctx, tool, "1.0.0")
	if err != nil {
		t.Fatal(err)
	}
	type lifecycle struct {
		Lifecycle struct {
			State     string    `json:"state"`
			RemovedAt time.Time `json:"removed_at"`
			RemovedBy string    `json:"removed_by"`
		} `json:"lifecycle"`
	}
	var removed lifecycle
	if err := json.Unmarshal(doc, &removed); err != nil || removed.Lifecycle.State != "removed" ||
		removed.Lifecycle.RemovedBy != me || time.Since(removed.Lifecycle.RemovedAt) > time.Minute {
		t.Fatalf("delete answered %s (%v), want the manifest removed by %s just now", doc, err, me)
	}
	lastEvent(t, ojs, subjects.AuditEvent(subjects.SystemTenant, envelope.SubjectSuffix(api.TypeToolDeleted)), func(d map[string]any) bool {
		return d["by"] == me && d["target"] == tool+"@1.0.0"
	})
	stagesSee("1.0.0", "removed")

	isRemoved := func(r api.Response) bool {
		return r.Status != api.StatusSuccess && r.Error != nil && r.Error.ECode == api.EToolRemoved
	}
	for _, v := range []string{"", "1.0.0"} {
		r := call(v)
		if !isRemoved(r) {
			t.Fatalf("a call of %s@%q after its removal: %+v, want E3004", tool, v, r.Error)
		}
		// Audit ends a refused call like any other: its record is final.
		rec, err := ac.Status(ctx, "demo", r.InvocationID)
		if err != nil || !rec.Status.Terminal() || rec.Error == nil {
			t.Fatalf("the refused call's record: %+v %v", rec, err)
		}
	}
	got, err := op.GetTool(ctx, tool, "1.0.0")
	var still lifecycle
	if err != nil || json.Unmarshal(got, &still) != nil || still.Lifecycle.State != "removed" || still.Lifecycle.RemovedBy != me {
		t.Fatalf("tools get of the removed version: %s %v", got, err)
	}
	listed := func(all bool) (api.ToolSummary, bool) {
		t.Helper()
		out, err := op.ListTools(ctx, api.ListRequest{All: all, PageSize: 200})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range out.Tools {
			if s.ToolID == tool {
				return s, true
			}
		}
		return api.ToolSummary{}, false
	}
	if _, ok := listed(false); ok {
		t.Error("tools list shows the removed tool")
	}
	if s, ok := listed(true); !ok || s.State != "removed" {
		t.Errorf("tools list --all: %+v %v, want the tool, removed", s, ok)
	}

	// The record as registered, put back over the removal, is an older
	// signed request: ignored.
	if _, err := tools.Put(ctx, key, registered.Value()); err != nil {
		t.Fatal(err)
	}
	lastEvent(t, ojs, subjects.AuditEvent(subjects.SystemTenant, "state.refused"), func(d map[string]any) bool {
		reason, _ := d["reason"].(string)
		return d["what"] == "tool" && len(reason) > 0
	})
	if r := call("1.0.0"); !isRemoved(r) {
		t.Fatalf("after the replayed registration: %+v, want the version still removed", r.Error)
	}

	// The same version is not registered again over its record; a new one is.
	if _, err := op.RegisterTool(ctx, manifest("1.0.0"), false); !errors.Is(err, &api.Error{Code: api.InvalidParameters, ECode: api.EDuplicateTool}) {
		t.Errorf("registering the removed version again: %v, want E3007", err)
	}
	if _, err := op.RegisterTool(ctx, manifest("1.1.0"), false); err != nil {
		t.Fatal(err)
	}
	stagesSee("1.1.0", "active")
	if r := call(""); r.Status != api.StatusSuccess {
		t.Fatalf("a new version after the removal: %+v", r.Error)
	}

	// Purge is an operator's (or admin's): another role's signature is
	// refused and audited.
	keys, err := busauth.LoadKeys(s.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	alice := issuePerson(t, keys, busauth.RoleApprover, "alice")
	asApprover, err := client.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	if err != nil {
		t.Fatal(err)
	}
	asApprover.Sign = alice.sign
	if err := asApprover.PurgeTool(ctx, tool, "1.0.0"); !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.ERoleNotPermitted}) {
		t.Fatalf("an approver's purge: %v, want E3245", err)
	}
	lastEvent(t, ojs, subjects.AuditEvent(subjects.SystemTenant, envelope.SubjectSuffix(api.TypeAdminRefused)), func(d map[string]any) bool {
		return d["action"] == subjects.SvcToolsPurge
	})
	if _, err := op.GetTool(ctx, tool, "1.0.0"); err != nil {
		t.Fatalf("the refused purge deleted the version: %v", err)
	}
	if err := op.PurgeTool(ctx, tool, "1.0.0"); err != nil {
		t.Fatal(err)
	}
	lastEvent(t, ojs, subjects.AuditEvent(subjects.SystemTenant, envelope.SubjectSuffix(api.TypeToolPurged)), func(d map[string]any) bool {
		return d["by"] == me && d["target"] == tool+"@1.0.0"
	})
	if _, err := op.GetTool(ctx, tool, "1.0.0"); !errors.Is(err, &api.Error{Code: api.ToolVersionNotFound, ECode: api.EVersionNotFound}) {
		t.Fatalf("tools get after the purge: %v, want E3002", err)
	}
	if _, err := tools.Get(ctx, key); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the purged version's key: %v, want it gone", err)
	}
}
