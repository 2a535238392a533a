package approval

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// fakeStore decides with the store's rule: the first decision wins.
type fakeStore struct {
	mu        sync.Mutex
	approvals map[string]kvstore.Approval
}

func (f *fakeStore) Decide(_ context.Context, tenant, id, state, by, reason string, _ *api.DecisionProof, check func(kvstore.Approval) error) (kvstore.Approval, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.approvals[tenant+"/"+id]
	if !ok {
		return kvstore.Approval{}, api.NewError(api.InvalidParameters, api.EApprovalUnknown, "unknown")
	}
	if a.State != kvstore.ApprovalPending {
		return a, api.NewError(api.StateConflict, api.EApprovalDecided, "already %s", a.State)
	}
	if check != nil {
		if err := check(a); err != nil {
			return a, err
		}
	}
	a.State, a.DecidedBy, a.Reason = state, by, reason
	f.approvals[tenant+"/"+id] = a
	return a, nil
}

func (f *fakeStore) PendingApprovals(context.Context) ([]kvstore.Approval, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []kvstore.Approval
	for _, a := range f.approvals {
		if a.State == kvstore.ApprovalPending {
			out = append(out, a)
		}
	}
	return out, nil
}

// fakeJS records what is published; nothing else of JetStream is used.
type fakeJS struct {
	jetstream.JetStream
	mu   sync.Mutex
	msgs []*nats.Msg
}

func (f *fakeJS) PublishMsg(_ context.Context, m *nats.Msg, _ ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.msgs = append(f.msgs, m)
	return &jetstream.PubAck{}, nil
}

func (f *fakeJS) subjects() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, m := range f.msgs {
		out = append(out, m.Subject)
	}
	return out
}

func parked(t *testing.T, id string, deadline time.Time) kvstore.Approval {
	t.Helper()
	inv := envelope.Invocation{ID: id, Tenant: "acme", Status: api.StatusPendingApproval, Event: envelope.Event{Seq: 9},
		Request: &api.Request{ToolID: "fs.write_file", Parameters: json.RawMessage(`{"path":"notes.txt"}`)}}
	b, err := json.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	return kvstore.Approval{InvocationID: id, Tenant: "acme", State: kvstore.ApprovalPending, Deadline: deadline, Invocation: b}
}

func TestDecide(t *testing.T) {
	ctx := context.Background()
	later := time.Now().Add(time.Hour)
	reviewed := ParkedDigest(parked(t, "i-1", later))
	if reviewed == "" {
		t.Fatal("no digest of the parked request")
	}
	// The same call with a parameter changed after the review.
	changed := parked(t, "i-1", later)
	changed.Invocation = []byte(strings.Replace(string(changed.Invocation), "notes.txt", "../secret", 1))
	other := ParkedDigest(changed)
	if other == reviewed {
		t.Fatal("a changed parameter leaves the digest as it was")
	}
	cases := []struct {
		name      string
		decisions []api.ApprovalDecision
		wantECode string // of the last decision
		wantState string
		wantNext  string // the stage the invocation was handed to
	}{
		{name: "approval resumes at authorize", decisions: []api.ApprovalDecision{{Approve: true, DecidedBy: "alice", RequestDigest: reviewed}},
			wantState: kvstore.ApprovalApproved, wantNext: subjects.Authorize},
		{name: "an approval of another request is refused", decisions: []api.ApprovalDecision{{Approve: true, DecidedBy: "alice", RequestDigest: other}},
			wantECode: api.EApprovalMismatch, wantState: kvstore.ApprovalPending},
		{name: "an approval naming no request is refused", decisions: []api.ApprovalDecision{{Approve: true, DecidedBy: "alice"}},
			wantECode: api.EApprovalMismatch, wantState: kvstore.ApprovalPending},
		{name: "denial ends through audit", decisions: []api.ApprovalDecision{{DecidedBy: "alice"}},
			wantState: kvstore.ApprovalDenied, wantNext: subjects.Audit},
		{name: "first decision wins", decisions: []api.ApprovalDecision{{DecidedBy: "alice"}, {Approve: true, DecidedBy: "bob", RequestDigest: reviewed}},
			wantECode: api.EApprovalDecided, wantState: kvstore.ApprovalDenied, wantNext: subjects.Audit},
		{name: "unknown invocation", decisions: []api.ApprovalDecision{{InvocationID: "nope", Approve: true, DecidedBy: "bob", RequestDigest: reviewed}},
			wantECode: api.EApprovalUnknown},
		{name: "a decision needs a decider", decisions: []api.ApprovalDecision{{Approve: true}}, wantECode: api.ERequestInvalid,
			wantState: kvstore.ApprovalPending},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := &fakeStore{approvals: map[string]kvstore.Approval{"acme/i-1": parked(t, "i-1", later)}}
			js := &fakeJS{}
			s := &Service{Store: st, JS: js, Log: slog.Default()}
			var err error
			for _, d := range c.decisions {
				d.Tenant = "acme"
				if d.InvocationID == "" {
					d.InvocationID = "i-1"
				}
				_, err = s.Decide(ctx, d)
			}
			if c.wantECode == "" && err != nil {
				t.Fatal(err)
			}
			if c.wantECode != "" {
				var ae *api.Error
				if !errors.As(err, &ae) || ae.ECode != c.wantECode {
					t.Fatalf("err %v, want %s", err, c.wantECode)
				}
			}
			if c.wantState != "" && st.approvals["acme/i-1"].State != c.wantState {
				t.Fatalf("state %s, want %s", st.approvals["acme/i-1"].State, c.wantState)
			}
			got := js.subjects()
			if c.wantNext == "" {
				if len(got) != 0 {
					t.Fatalf("published %v", got)
				}
				return
			}
			// One audit event and one hand-off, once: the losing decision publishes nothing.
			if len(got) != 2 || got[1] != subjects.Pipe(c.wantNext, "normal", "acme") {
				t.Fatalf("published %v, want an audit event and a hand-off to %s", got, c.wantNext)
			}
		})
	}
}

func TestSweep(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	st := &fakeStore{approvals: map[string]kvstore.Approval{
		"acme/late":    parked(t, "late", now.Add(-time.Second)),
		"acme/waiting": parked(t, "waiting", now.Add(time.Hour)),
	}}
	decided := parked(t, "decided", now.Add(-time.Second))
	decided.State = kvstore.ApprovalApproved
	st.approvals["acme/decided"] = decided
	js := &fakeJS{}
	n, err := (&Service{Store: st, JS: js, Log: slog.Default()}).Sweep(ctx, now)
	if err != nil || n != 1 {
		t.Fatalf("swept %d, %v; want 1", n, err)
	}
	for id, want := range map[string]string{"late": kvstore.ApprovalExpired, "waiting": kvstore.ApprovalPending, "decided": kvstore.ApprovalApproved} {
		if got := st.approvals["acme/"+id].State; got != want {
			t.Errorf("%s is %s, want %s", id, got, want)
		}
	}
	if got := js.subjects(); len(got) != 2 || got[1] != subjects.Pipe(subjects.Audit, "normal", "acme") {
		t.Fatalf("published %v", got)
	}
}
