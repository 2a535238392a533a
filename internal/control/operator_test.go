package control

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/modelrouter"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// fakeAdmin is an in-memory adminStore that counts writes.
type fakeAdmin struct {
	writes int
	policy kvstore.PolicyBundle
	by     string // the last recorded author
}

func (f *fakeAdmin) TransitionBreaker(_ context.Context, key string, change func(*kvstore.BreakerState) bool) (kvstore.BreakerState, bool, error) {
	st := kvstore.BreakerState{Key: key, State: kvstore.BreakerClosed}
	if !change(&st) {
		return st, false, nil
	}
	f.writes++
	f.by = st.By
	st.Revision = uint64(f.writes)
	return st, true, nil
}

func (f *fakeAdmin) PushPolicy(_ context.Context, b kvstore.PolicyBundle) (uint64, error) {
	f.writes++
	f.policy, f.by = b, b.PushedBy
	return uint64(f.writes), nil
}

func (f *fakeAdmin) DeletePolicy(context.Context) error {
	f.writes++
	f.policy = kvstore.PolicyBundle{}
	return nil
}

func (f *fakeAdmin) Policy(context.Context) (kvstore.PolicyBundle, bool, error) {
	return f.policy, f.policy.Modules != nil, nil
}

func (f *fakeAdmin) Budgets(context.Context, string) ([]kvstore.SessionUsage, error) {
	return nil, nil
}

func (f *fakeAdmin) WatchPolicy(context.Context, func(kvstore.PolicyBundle, bool, error)) error {
	return nil
}

func (f *fakeAdmin) PushHooks(_ context.Context, set kvstore.HookSet) (uint64, error) {
	f.writes++
	f.by = set.PushedBy
	return uint64(f.writes), nil
}

func (f *fakeAdmin) HookSets(context.Context) ([]kvstore.HookSet, error) { return nil, nil }

func (f *fakeAdmin) DeleteHooks(context.Context, string) error { f.writes++; return nil }

func (f *fakeAdmin) Revoke(_ context.Context, _ string, _ time.Time, _, by string, _ *api.DecisionProof) error {
	f.writes++
	f.by = by
	return nil
}

func (f *fakeAdmin) Breakers(context.Context) ([]kvstore.BreakerState, error) { return nil, nil }

func (f *fakeAdmin) PutSignedModel(_ context.Context, data []byte, _ string, _ *api.DecisionProof) (modelrouter.Model, error) {
	f.writes++
	return modelrouter.Decode(data)
}

func (f *fakeAdmin) Models(context.Context) ([]modelrouter.Model, error) { return nil, nil }

func (f *fakeAdmin) DeleteModel(context.Context, string) error { f.writes++; return nil }

func (f *fakeAdmin) PutSignedRoutingPolicy(context.Context, []byte, string, *api.DecisionProof) error {
	f.writes++
	return nil
}

func (f *fakeAdmin) PutDocSource(_ context.Context, _ string, _ json.RawMessage, by string, _ *api.DecisionProof) (uint64, error) {
	f.writes++
	f.by = by
	return uint64(f.writes), nil
}

func (f *fakeAdmin) DocSources(context.Context) ([]kvstore.DocSourceRecord, error) { return nil, nil }

func (f *fakeAdmin) DeleteDocSource(context.Context, string) error { f.writes++; return nil }

// adminRequests are a valid request of every administrative endpoint.
var adminRequests = map[string]string{
	subjects.SvcPolicyPush:     `{"modules":{"authz.rego":` + jsonString(policy.DefaultModule()) + `},"by":"mallory"}`,
	subjects.SvcPolicyGet:      `{}`,
	subjects.SvcPolicyReset:    `{"by":"mallory"}`,
	subjects.SvcHooksPush:      `{"tenant_id":"acme","doc":{"hooks":[{"on":"budget_exceeded","action":"continue"}]},"by":"mallory"}`,
	subjects.SvcHooksList:      `{}`,
	subjects.SvcHooksDelete:    `{"tenant_id":"acme","by":"mallory"}`,
	subjects.SvcTokensRevoke:   `{"jti":"tok-1","until":"2099-01-01T00:00:00Z","by":"mallory"}`,
	subjects.SvcBreakersList:   `{}`,
	subjects.SvcBreakersSet:    `{"key":"echo","state":"open","by":"mallory"}`,
	subjects.SvcModelsRegister: `{"model":{"name":"m","api":"openai","upstream_model":"x","endpoints":["https://api.example.com/v1"],"tier":"small","context_window":1000,"max_output_tokens":100,"price":{"input_per_1k":0.001,"output_per_1k":0.002}},"by":"mallory"}`,
	subjects.SvcModelsList:     `{}`,
	subjects.SvcModelsDelete:   `{"name":"m","by":"mallory"}`,
	subjects.SvcModelsPolicy:   `{"reset":true,"by":"mallory"}`,
	subjects.SvcBudgetsList:    `{"near":0.8}`,

	subjects.SvcDocsSourceAdd:    `{"source":{"name":"handbook","url":"http://127.0.0.1:9/mcp"},"by":"mallory"}`,
	subjects.SvcDocsSourceList:   `{}`,
	subjects.SvcDocsSourceRemove: `{"name":"handbook","by":"mallory"}`,
}

// writers are the endpoints that change something, and so are audited.
var writers = map[string]bool{subjects.SvcPolicyPush: true, subjects.SvcPolicyReset: true, subjects.SvcHooksPush: true, subjects.SvcHooksDelete: true,
	subjects.SvcTokensRevoke: true, subjects.SvcBreakersSet: true, subjects.SvcModelsRegister: true,
	subjects.SvcModelsDelete: true, subjects.SvcModelsPolicy: true, subjects.SvcDocsSourceAdd: true, subjects.SvcDocsSourceRemove: true}

func jsonString(s string) string {
	b := []byte{'"'}
	for _, r := range s {
		switch r {
		case '"', '\\':
			b = append(b, '\\', byte(r))
		case '\n':
			b = append(b, '\\', 'n')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, string(r)...)
		}
	}
	return string(append(b, '"'))
}

type subjectRequest struct {
	fakeRequest
	subject string
}

func (r *subjectRequest) Subject() string        { return r.subject }
func (r *subjectRequest) Headers() micro.Headers { return nil }

func adminHandlers(f *fakeAdmin, id Identify, audited *[]stages.Output) *handlers {
	return &handlers{admin: f, identify: id, publish: func(_ context.Context, o stages.Output) error {
		*audited = append(*audited, o)
		return nil
	}}
}

// TestAdminEndpoints: with an identifying service, every administrative
// endpoint refuses a request the identity check refuses (E3219), changes
// nothing and audits the refusal; one it accepts records the identity, never the body's by, and
// each change is audited once.
func TestAdminEndpoints(t *testing.T) {
	// The re-drive and shadow endpoints, administrative too, have tests
	// of their own against a real bus (internal/node: the bus suites'
	// redriveSigned and shadowSigned).
	admin := (&handlers{}).adminEndpoints()
	if len(adminRequests) != len(admin) {
		t.Fatalf("%d requests for %d endpoints", len(adminRequests), len(admin))
	}
	refuse := func(string, nats.Header, []byte) (string, error) { return "", errors.New("unsigned") }
	accept := func(string, nats.Header, []byte) (string, error) { return "operator:alice", nil }
	for _, subject := range subjects.AdminServices {
		if admin[subject] == nil {
			continue
		}
		t.Run(subject, func(t *testing.T) {
			f := &fakeAdmin{}
			var audited []stages.Output
			h := adminHandlers(f, refuse, &audited)
			req := &subjectRequest{fakeRequest{data: []byte(adminRequests[subject])}, subject}
			h.adminEndpoints()[subject](req)
			// The refusal itself is audited (admin.refused); nothing else.
			if got := req.ecode(t); got != api.EAdminUnverified || f.writes != 0 || len(audited) != 1 ||
				audited[0].Subject != subjects.AuditEvent(subjects.SystemTenant, "admin.refused") {
				t.Fatalf("refused identity: E-code %q, %d writes, %d audit events; want E3219, no write and the refusal audited", got, f.writes, len(audited))
			}
			f = &fakeAdmin{}
			audited = nil
			h = adminHandlers(f, accept, &audited)
			req = &subjectRequest{fakeRequest{data: []byte(adminRequests[subject])}, subject}
			h.adminEndpoints()[subject](req)
			if got := req.ecode(t); got != "" {
				t.Fatalf("accepted identity: E-code %q (%s)", got, req.body)
			}
			if !writers[subject] {
				if f.writes != 0 || len(audited) != 0 {
					t.Fatalf("a read wrote %d times and audited %d events", f.writes, len(audited))
				}
				return
			}
			if f.writes != 1 || len(audited) != 1 {
				t.Fatalf("%d writes, %d audit events; want one of each", f.writes, len(audited))
			}
			if f.by != "" && f.by != "operator:alice" {
				t.Fatalf("recorded %q, want the identity operator:alice", f.by)
			}
			if !strings.Contains(string(audited[0].Data), `"by":"operator:alice"`) {
				t.Fatalf("audit event %s does not name operator:alice", audited[0].Data)
			}
		})
	}
}

// FuzzAdminRequests: no request body makes an administrative endpoint
// panic or leave the request unanswered.
func FuzzAdminRequests(f *testing.F) {
	for _, body := range adminRequests {
		f.Add(0, []byte(body))
	}
	f.Add(1, []byte(`{"modules":{"a.rego":"package x"}}`))
	f.Add(2, []byte(`{"tenant_id":"a.b","doc":null}`))
	f.Add(5, []byte(`{"jti":"","until":"x"}`))
	f.Add(7, []byte(`{"key":"k","state":"ajar"}`))
	f.Fuzz(func(t *testing.T, which int, body []byte) {
		subject := subjects.AdminServices[uint(which)%uint(len(subjects.AdminServices))]
		var audited []stages.Output
		h := adminHandlers(&fakeAdmin{}, nil, &audited)
		req := &subjectRequest{fakeRequest{data: body}, subject}
		h.adminEndpoints()[subject](req)
		if req.code == "" && req.answer == nil {
			t.Fatalf("%s %q: no answer", subject, body)
		}
	})
}
