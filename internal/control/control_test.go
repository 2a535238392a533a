package control

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/stages/execute/kind"
	"github.com/toolgate/toolgate/subjects"
)

// fakeStore keeps records in memory and registers manifests into a registry,
// as the real store's watch would.
type fakeStore struct {
	records         map[string]api.Record
	reg             *tools.Registry
	checkpointStore // not served by these tests
}

func (f *fakeStore) Status(_ context.Context, _, id string) (api.Record, error) {
	rec, ok := f.records[id]
	if !ok {
		return api.Record{}, kvstore.ErrNotFound
	}
	return rec, nil
}

func (f *fakeStore) UpdateRecord(_ context.Context, _, id string, change func(*api.Record)) (api.Record, error) {
	rec := f.records[id]
	if rec.Status.Terminal() {
		return rec, nil
	}
	change(&rec)
	f.records[id] = rec
	return rec, nil
}

func (f *fakeStore) RegisterSignedTool(_ context.Context, doc []byte, _ bool, _ string, _ *api.DecisionProof) (*tools.Manifest, error) {
	m, err := tools.Parse(doc)
	if err != nil {
		return nil, err
	}
	f.reg.Put(m)
	return m, nil
}

// fakeRequest is a micro request that keeps the answer.
type fakeRequest struct {
	micro.Request
	data   []byte
	code   string
	body   []byte
	answer any
}

func (r *fakeRequest) Data() []byte { return r.data }

// Headers: a request from toolgate's own account (no Nats-Request-Info).
func (r *fakeRequest) Headers() micro.Headers { return nil }

func (r *fakeRequest) RespondJSON(v any, _ ...micro.RespondOpt) error {
	r.answer = v
	return nil
}

func (r *fakeRequest) Error(code, _ string, data []byte, _ ...micro.RespondOpt) error {
	r.code, r.body = code, data
	return nil
}

// ecode is the E-code of an error answer, or "".
func (r *fakeRequest) ecode(t *testing.T) string {
	t.Helper()
	if r.code == "" {
		return ""
	}
	var te api.Error
	if err := json.Unmarshal(r.body, &te); err != nil {
		t.Fatalf("error body %s: %v", r.body, err)
	}
	return te.ECode
}

func TestHandlers(t *testing.T) {
	manifest := `{"id":"t:echo","name":"echo","version":"1.0.0","description":"d","kind":"builtin",
		"builtin":{"function":"echo"},"input_schema":{"type":"object"}}`
	cases := []struct {
		name      string
		handler   func(*handlers) micro.HandlerFunc
		data      string
		wantECode string
		check     func(t *testing.T, h *handlers, answer any)
		// wantAudit is the subject of the one audit event the case
		// publishes, "" for none.
		wantAudit string
		// kinds, when set, are the kinds whose checks registration runs.
		kinds *kind.Registry
	}{
		{name: "status of a known invocation", handler: func(h *handlers) micro.HandlerFunc { return h.endpoints()[subjects.SvcStatus].operator },
			data: `{"tenant_id":"acme","invocation_id":"done"}`,
			check: func(t *testing.T, _ *handlers, answer any) {
				if rec, _ := answer.(api.Record); rec.Status != api.StatusSuccess {
					t.Fatalf("answer %+v", answer)
				}
			}},
		{name: "status of an unknown invocation", handler: func(h *handlers) micro.HandlerFunc { return h.endpoints()[subjects.SvcStatus].operator },
			data: `{"tenant_id":"acme","invocation_id":"nope"}`, wantECode: api.EInvocationNotFound},
		{name: "status without an id", handler: func(h *handlers) micro.HandlerFunc { return h.endpoints()[subjects.SvcStatus].operator },
			data: `{"tenant_id":"acme"}`, wantECode: api.ERequestInvalid},
		{name: "register a valid manifest", handler: func(h *handlers) micro.HandlerFunc { return h.register },
			data: `{"manifest":` + manifest + `}`,
			check: func(t *testing.T, h *handlers, answer any) {
				if a, _ := answer.(api.ToolRequest); a.ToolID != "t:echo" || a.Version != "1.0.0" || !h.reg.Has("t:echo", "1.0.0") {
					t.Fatalf("answer %+v", answer)
				}
			},
			wantAudit: "audit._system.admin.tool.registered"},
		{name: "register without a manifest", handler: func(h *handlers) micro.HandlerFunc { return h.register },
			data: `{"replace":true}`, wantECode: api.EInvalidManifest},
		{name: "register an invalid manifest", handler: func(h *handlers) micro.HandlerFunc { return h.register },
			data: `{"manifest":{"id":"t:bad"}}`, wantECode: api.EInvalidManifest},
		{name: "register a manifest its kind refuses", handler: func(h *handlers) micro.HandlerFunc { return h.register },
			data: `{"manifest":` + manifest + `}`, wantECode: api.EInvalidManifest,
			kinds: kind.NewRegistry(kind.Kind{Name: "builtin", Validate: func(spec json.RawMessage) error {
				return fmt.Errorf("no builtin %s here", spec)
			}}),
			check: func(t *testing.T, h *handlers, _ any) {
				if h.reg.Has("t:echo", "1.0.0") {
					t.Fatal("a manifest its kind refused was registered")
				}
			}},
		{name: "get an unknown tool", handler: func(h *handlers) micro.HandlerFunc { return func(r micro.Request) { h.get(r, true) } },
			data: `{"tool_id":"nope"}`, wantECode: api.EToolNotFound},
		{name: "list filters by category", handler: func(h *handlers) micro.HandlerFunc { return func(r micro.Request) { h.search(r, "") } },
			data: `{"category":"none-such"}`,
			check: func(t *testing.T, _ *handlers, answer any) {
				if l, _ := answer.(api.ListResponse); l.TotalCount != 0 || l.Tools == nil {
					t.Fatalf("answer %+v", answer)
				}
			}},
		{name: "cancel without an id", handler: func(h *handlers) micro.HandlerFunc { return h.endpoints()[subjects.SvcCancel].operator },
			data: `{"tenant_id":"acme"}`, wantECode: api.ERequestInvalid},
		{name: "cancel of an ended invocation keeps its status", handler: func(h *handlers) micro.HandlerFunc { return h.endpoints()[subjects.SvcCancel].operator },
			data: `{"tenant_id":"acme","invocation_id":"done"}`,
			check: func(t *testing.T, h *handlers, answer any) {
				if rec, _ := answer.(api.Record); rec.Status != api.StatusSuccess || rec.CancelRequested {
					t.Fatalf("answer %+v", answer)
				}
			}},
		{name: "decide with a malformed request", handler: func(h *handlers) micro.HandlerFunc { return h.decide },
			data: `{`, wantECode: api.ERequestInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reg := tools.NewRegistry()
			st := &fakeStore{reg: reg, records: map[string]api.Record{
				"done": {InvocationID: "done", Tenant: "acme", Status: api.StatusSuccess},
			}}
			var audited []stages.Output
			h := &handlers{store: st, reg: reg, publish: func(_ context.Context, o stages.Output) error {
				audited = append(audited, o)
				return nil
			}}
			if c.kinds != nil {
				h.checkManifest = c.kinds.Check
			}
			req := &fakeRequest{data: []byte(c.data)}
			c.handler(h)(req)
			switch {
			case c.wantAudit == "" && len(audited) > 0:
				t.Errorf("audited %s, want nothing", audited[0].Subject)
			case c.wantAudit != "" && (len(audited) != 1 || audited[0].Subject != c.wantAudit):
				t.Errorf("audited %+v, want one event on %s", audited, c.wantAudit)
			}
			if got := req.ecode(t); got != c.wantECode {
				t.Fatalf("E-code %q, want %q (%s)", got, c.wantECode, req.body)
			}
			if c.check != nil {
				c.check(t, h, req.answer)
			}
		})
	}
}

func (f *fakeStore) PurgeTool(context.Context, string, string) error { return nil }
func (f *fakeStore) Tool(context.Context, string, string) (kvstore.ToolRecord, error) {
	return kvstore.ToolRecord{}, api.NewError(api.ToolNotFound, api.EToolNotFound, "no such tool")
}
func (f *fakeStore) HoldToolChange(context.Context, string, string, kvstore.ToolPending) error {
	return nil
}
func (f *fakeStore) RemoveTool(context.Context, string, string, kvstore.ToolRemoval) (*tools.Manifest, error) {
	return nil, nil
}

func (f *fakeStore) PendingApprovals(context.Context) ([]api.Approval, error) { return nil, nil }

func (f *fakeStore) Approval(context.Context, string, string) (api.Approval, error) {
	return api.Approval{}, kvstore.ErrNotFound
}

func (f *fakeStore) Usage(context.Context, string, string) (kvstore.Usage, error) {
	return kvstore.Usage{}, nil
}

func (f *fakeStore) ToolStats(context.Context) (map[string]kvstore.ToolShard, error) { return nil, nil }
func (f *fakeStore) ModelStats(context.Context) (map[kvstore.ModelTask]kvstore.ModelShard, error) {
	return nil, nil
}
func (f *fakeStore) ModelStatsTTL() time.Duration { return time.Hour }

func (f *fakeStore) SaveCapability(context.Context, api.CapabilityReport) error { return nil }

func (f *fakeStore) Capability(context.Context, string, string) (api.CapabilityReport, error) {
	return api.CapabilityReport{}, api.NewError(api.InvalidParameters, api.ECapabilityUnknown, "none")
}

// TestEndpointsServeTheTable: every endpoint of subjects.ControlEndpoints
// has a handler for each form it is served in, and the service has no
// handler the table does not name.
func TestEndpointsServeTheTable(t *testing.T) {
	h := &handlers{}
	eps := h.endpoints()
	if len(eps) != len(subjects.ControlEndpoints) {
		t.Errorf("%d handlers for %d endpoints", len(eps), len(subjects.ControlEndpoints))
	}
	for _, ep := range subjects.ControlEndpoints {
		hd, ok := eps[ep.Subject]
		switch {
		case !ok:
			t.Errorf("%s: no handler", ep.Subject)
		case (ep.Operator || ep.Admin) != (hd.operator != nil):
			t.Errorf("%s: served to operators %v, handler %v", ep.Subject, ep.Operator || ep.Admin, hd.operator != nil)
		case ep.Tenant != (hd.scoped != nil):
			t.Errorf("%s: tenant-scoped %v, handler %v", ep.Subject, ep.Tenant, hd.scoped != nil)
		}
	}
	served, err := h.serving(true)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, ep := range subjects.ControlEndpoints {
		if ep.Operator || ep.Admin {
			want++
		}
		if ep.Tenant {
			want++
		}
	}
	if len(served) != want {
		t.Errorf("%d micro endpoints, want %d", len(served), want)
	}
	without, err := h.serving(false)
	if err != nil {
		t.Fatal(err)
	}
	if len(served)-len(without) != 3 {
		t.Errorf("without approvals %d endpoints fewer, want 3 (approval, cancel and the tenant's cancel)", len(served)-len(without))
	}
}

// TestScopedRequests: a tenant-scoped request takes its tenant from the
// subject, refuses a body naming another (E3014) and one lacking what the
// endpoint needs (E3005); the operator's form needs the tenant in the body.
func TestScopedRequests(t *testing.T) {
	st := &fakeStore{reg: tools.NewRegistry(), records: map[string]api.Record{
		"done": {InvocationID: "done", Tenant: "acme", Status: api.StatusSuccess},
	}}
	h := &handlers{store: st, reg: st.reg}
	status := h.endpoints()[subjects.SvcStatus]
	for _, c := range []struct {
		name, body, tenant, ecode string
	}{
		{"the subject's tenant", `{"invocation_id":"done"}`, "acme", ""},
		{"the same tenant named", `{"tenant_id":"acme","invocation_id":"done"}`, "acme", ""},
		{"another tenant named", `{"tenant_id":"other","invocation_id":"done"}`, "acme", api.ETenantMismatch},
		{"no invocation", `{}`, "acme", api.ERequestInvalid},
		{"an empty body", ``, "acme", api.ERequestInvalid},
		{"operator without a tenant", `{"invocation_id":"done"}`, "", api.ERequestInvalid},
		{"operator with a tenant", `{"tenant_id":"acme","invocation_id":"done"}`, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := &fakeRequest{data: []byte(c.body)}
			if c.tenant == "" {
				status.operator(req)
			} else {
				status.scoped(c.tenant, req)
			}
			if got := req.ecode(t); got != c.ecode {
				t.Fatalf("E-code %q, want %q (%s)", got, c.ecode, req.body)
			}
			if rec, _ := req.answer.(api.Record); c.ecode == "" && rec.InvocationID != "done" {
				t.Fatalf("answer %+v", req.answer)
			}
		})
	}
	// approvals.list on the tenant's endpoint takes an empty body.
	req := &fakeRequest{}
	h.endpoints()[subjects.SvcApprovalsList].scoped("acme", req)
	if got := req.ecode(t); got != "" {
		t.Fatalf("approvals.list with an empty body: E-code %q", got)
	}
}
