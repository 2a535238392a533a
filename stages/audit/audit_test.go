package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// fakeStore keeps status records and usage in memory.
type fakeStore struct {
	records  map[string]api.Record
	usage    map[string]kvstore.Usage
	statusEr error
	// atEnd is the usage as it stood when each terminal status was
	// written, by invocation: what a caller that saw the end would find.
	atEnd map[string]map[string]kvstore.Usage
}

func newFakeStore() *fakeStore {
	return &fakeStore{records: map[string]api.Record{}, usage: map[string]kvstore.Usage{}}
}

func (f *fakeStore) SetStatus(_ context.Context, rec api.Record) (api.Record, bool, error) {
	if f.statusEr != nil {
		return api.Record{}, false, f.statusEr
	}
	if cur, ok := f.records[rec.InvocationID]; ok && cur.Status.Terminal() {
		return cur, false, nil
	}
	if rec.UpdatedAt.IsZero() {
		rec.UpdatedAt = time.Now().UTC() // as kvstore's
	}
	f.records[rec.InvocationID] = rec
	if f.atEnd == nil {
		f.atEnd = map[string]map[string]kvstore.Usage{}
	}
	f.atEnd[rec.InvocationID] = maps.Clone(f.usage)
	return rec, true, nil
}

func (f *fakeStore) Status(_ context.Context, _, id string) (api.Record, error) {
	rec, ok := f.records[id]
	if !ok {
		return api.Record{}, kvstore.ErrNotFound
	}
	return rec, nil
}

func (f *fakeStore) UpdateUsage(_ context.Context, tenant, session string, change func(*kvstore.Usage) error) (kvstore.Usage, error) {
	u := f.usage[tenant+"/"+session]
	if err := change(&u); err != nil {
		return u, err
	}
	f.usage[tenant+"/"+session] = u
	return u, nil
}

func TestAudit(t *testing.T) {
	ctx := context.Background()
	succeeded := func() *envelope.Invocation {
		inv := &envelope.Invocation{ID: "i-1", Tenant: "acme", Event: envelope.Event{Seq: 7}, Status: api.StatusPending,
			Request: &api.Request{ToolID: "echo"}}
		inv.Succeed(subjects.Verify, json.RawMessage(`{"ok":true}`))
		return inv
	}
	admitted := func(inv *envelope.Invocation) *envelope.Invocation {
		inv.Authz = &envelope.Authorization{Session: "s", Reserved: true, CostPerCall: 0.5}
		inv.Metadata.DurationMS, inv.Metadata.StartedAt = 40, "2026-01-01T00:00:00Z"
		return inv
	}
	subjectsOf := func(outs []stages.Output) string {
		var s []string
		for _, o := range outs {
			s = append(s, o.Subject)
		}
		return strings.Join(s, " ")
	}

	t.Run("success: status, terminal event and result", func(t *testing.T) {
		st := newFakeStore()
		outs, err := (&Auditor{store: st}).Process(ctx, succeeded())
		if err != nil {
			t.Fatal(err)
		}
		want := subjects.AuditEvent("acme", envelope.SubjectSuffix(api.TypeSucceeded)) + " " + subjects.Result("acme", "", "i-1")
		if got := subjectsOf(outs); got != want {
			t.Fatalf("outputs %q, want %q", got, want)
		}
		if !strings.HasPrefix(outs[1].MsgID, "7.") || !strings.HasSuffix(outs[1].MsgID, ".result") {
			t.Fatalf("result message id %q", outs[1].MsgID)
		}
		if rec := st.records["i-1"]; rec.Status != api.StatusSuccess || rec.Seq != 7 || rec.Response == nil {
			t.Fatalf("stored %+v", rec)
		}
	})

	t.Run("a carried tool.invoked goes out first, under execute's message id", func(t *testing.T) {
		carried := func(change func(*envelope.Invocation)) *envelope.Invocation {
			inv := succeeded()
			running := *inv
			running.Status = api.StatusRunning
			if change != nil {
				change(&running)
			}
			ev, err := stages.AuditEvent(subjects.Execute, &running, api.TypeInvoked, running.Audit())
			if err != nil {
				t.Fatal(err)
			}
			inv.Invoked = ev.Data
			return inv
		}
		invokedSubject := subjects.AuditEvent("acme", envelope.SubjectSuffix(api.TypeInvoked))
		succeededSubject := subjects.AuditEvent("acme", envelope.SubjectSuffix(api.TypeSucceeded)) + " " + subjects.Result("acme", "", "i-1")
		inv := carried(nil)
		outs, err := (&Auditor{store: newFakeStore()}).Process(ctx, inv)
		if err != nil {
			t.Fatal(err)
		}
		if got := subjectsOf(outs); got != invokedSubject+" "+succeededSubject {
			t.Fatalf("outputs %q", got)
		}
		if want := inv.MsgID("audit." + envelope.SubjectSuffix(api.TypeInvoked)); outs[0].MsgID != want || !bytes.Equal(outs[0].Data, inv.Invoked) {
			t.Fatalf("carried event published as %q (%s), want %q and the bytes execute made", outs[0].MsgID, outs[0].Data, want)
		}
		// What is not execute's tool.invoked about this very call is not
		// published.
		for name, change := range map[string]func(*envelope.Invocation){
			"another invocation": func(r *envelope.Invocation) { r.ID = "i-9" },
			"another tenant":     func(r *envelope.Invocation) { r.Tenant = "other" },
		} {
			outs, err := (&Auditor{store: newFakeStore()}).Process(ctx, carried(change))
			if err != nil {
				t.Fatal(err)
			}
			if got := subjectsOf(outs); got != succeededSubject {
				t.Errorf("%s: outputs %q", name, got)
			}
		}
		inv = succeeded()
		ev, err := stages.AuditEvent(subjects.Verify, inv, api.TypeSucceeded, inv.Audit())
		if err != nil {
			t.Fatal(err)
		}
		inv.Invoked = ev.Data
		if outs, err := (&Auditor{store: newFakeStore()}).Process(ctx, inv); err != nil || subjectsOf(outs) != succeededSubject {
			t.Errorf("another event type carried: outputs %q, %v", subjectsOf(outs), err)
		}
	})

	t.Run("an invocation that never ended ends as internal error", func(t *testing.T) {
		st := newFakeStore()
		inv := &envelope.Invocation{ID: "i-2", Tenant: "acme", Status: api.StatusPending, EndedBy: "route"}
		if _, err := (&Auditor{store: st}).Process(ctx, inv); err != nil {
			t.Fatal(err)
		}
		if inv.Status != api.StatusError || inv.Error == nil || inv.Error.ECode != api.EInternal {
			t.Fatalf("status %s error %v", inv.Status, inv.Error)
		}
		if st.records["i-2"].Status != api.StatusError {
			t.Fatalf("stored %+v", st.records["i-2"])
		}
	})

	t.Run("system tenant: audit event only", func(t *testing.T) {
		st := newFakeStore()
		inv := succeeded()
		inv.Tenant = subjects.SystemTenant
		outs, err := (&Auditor{store: st}).Process(ctx, inv)
		if err != nil || len(outs) != 1 || !strings.HasPrefix(outs[0].Subject, "audit.") {
			t.Fatalf("outputs %q, %v", subjectsOf(outs), err)
		}
		if len(st.records) != 0 {
			t.Fatal("status stored for the system tenant")
		}
	})

	t.Run("a repeated publish gets no second result and no second terminal event", func(t *testing.T) {
		st := newFakeStore()
		inv := &envelope.Invocation{ID: "i-3", Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: 8}}
		inv.Fail(subjects.Validate, api.NewError(api.InvalidParameters, api.EDuplicateInvocation, "again").
			WithDetail("same_request", true))
		outs, err := (&Auditor{store: st}).Process(ctx, inv)
		duplicate := subjects.AuditEvent("acme", envelope.SubjectSuffix(api.TypeDuplicate))
		if err != nil || subjectsOf(outs) != duplicate {
			t.Fatalf("outputs %q, %v; want only %s", subjectsOf(outs), err, duplicate)
		}
		if len(st.records) != 0 {
			t.Fatalf("a repeat wrote a status: %+v", st.records)
		}
	})

	t.Run("a different request reusing the id is refused without a terminal event", func(t *testing.T) {
		st := newFakeStore()
		inv := &envelope.Invocation{ID: "i-3", Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: 9}}
		inv.Fail(subjects.Validate, api.NewError(api.InvalidParameters, api.EDuplicateInvocation, "reused"))
		outs, err := (&Auditor{store: st}).Process(ctx, inv)
		want := subjects.AuditEvent("acme", envelope.SubjectSuffix(api.TypeDuplicate)) + " " + subjects.Result("acme", "", "i-3")
		if err != nil || subjectsOf(outs) != want {
			t.Fatalf("outputs %q, %v; want %q", subjectsOf(outs), err, want)
		}
		if len(st.records) != 0 {
			t.Fatalf("a reuse wrote a status: %+v", st.records)
		}
	})

	t.Run("the first ending wins", func(t *testing.T) {
		// Execute's success went on through verify; execute died before
		// acking, and its redelivery ended the call with E3023 straight to
		// audit: two messages end one invocation.
		st := newFakeStore()
		a := &Auditor{store: st}
		first := stages.WithInput(ctx, "TOOLGATE_PIPELINE", 10, 0)
		if outs, err := a.Process(first, succeeded()); err != nil || len(outs) != 2 {
			t.Fatalf("first ending: %q, %v", subjectsOf(outs), err)
		}
		unknown := &envelope.Invocation{ID: "i-1", Tenant: "acme", Event: envelope.Event{Seq: 7}, Status: api.StatusRunning,
			Request: &api.Request{ToolID: "echo"}}
		unknown.Fail(subjects.Execute, api.NewError(api.ToolExecutionError, api.EOutcomeUnknown, "interrupted"))
		for _, c := range []context.Context{stages.WithInput(ctx, "TOOLGATE_PIPELINE", 12, 0), ctx} {
			if outs, err := a.Process(c, unknown); err != nil || len(outs) != 0 {
				t.Fatalf("second ending published %q, %v", subjectsOf(outs), err)
			}
		}
		if rec := st.records["i-1"]; rec.Status != api.StatusSuccess {
			t.Fatalf("stored %+v", rec)
		}
		// A redelivery of the first ending publishes its outputs again.
		if outs, err := a.Process(first, succeeded()); err != nil || len(outs) != 2 {
			t.Fatalf("redelivered first ending: %q, %v", subjectsOf(outs), err)
		}
		// Another request that reused the id still gets its own ending.
		reuse := &envelope.Invocation{ID: "i-1", Tenant: "acme", Event: envelope.Event{Seq: 9}, Status: api.StatusPending}
		reuse.Fail(subjects.Validate, api.NewError(api.InvalidParameters, api.EDuplicateInvocation, "reused"))
		if outs, err := a.Process(stages.WithInput(ctx, "TOOLGATE_PIPELINE", 13, 0), reuse); err != nil || len(outs) != 2 {
			t.Fatalf("reuse: %q, %v", subjectsOf(outs), err)
		}
	})

	t.Run("an ending whose hop a restart lost is published again from its record", func(t *testing.T) {
		// Audit recorded the success and died before its outputs were
		// stored; the restart lost the hops in memory and re-drove the
		// call, which execute ended E3023 at a pipeline sequence counted
		// anew.
		st := newFakeStore()
		a := &Auditor{store: st}
		if outs, err := a.Process(stages.WithInput(ctx, "TOOLGATE_PIPELINE", 204, 0), succeeded()); err != nil || len(outs) != 2 {
			t.Fatalf("first ending: %q, %v", subjectsOf(outs), err)
		}
		redriven := func() *envelope.Invocation {
			inv := &envelope.Invocation{ID: "i-1", Tenant: "acme", Event: envelope.Event{Seq: 7}, Status: api.StatusRunning,
				Request: &api.Request{ToolID: "echo"}}
			inv.Fail(subjects.Execute, api.NewError(api.ToolExecutionError, api.EOutcomeUnknown, "interrupted"))
			return inv
		}
		again := stages.WithInput(ctx, "TOOLGATE_PIPELINE", 3, 0)
		if outs, err := a.Process(again, redriven()); err != nil || len(outs) != 0 {
			t.Fatalf("without recovery the second ending published %q, %v", subjectsOf(outs), err)
		}
		var asked []string
		published := func(has bool) func(context.Context, string) (bool, error) {
			return func(_ context.Context, subject string) (bool, error) {
				asked = append(asked, subject)
				return has, nil
			}
		}
		a.RecoverEndings(time.Now(), time.Minute, published(true))
		outs, err := a.Process(again, redriven())
		if err != nil || len(outs) != 2 {
			t.Fatalf("recovered ending: %q, %v", subjectsOf(outs), err)
		}
		for _, o := range outs {
			if !bytes.Contains(o.Data, []byte(`"success"`)) || bytes.Contains(o.Data, []byte(api.EOutcomeUnknown)) {
				t.Fatalf("recovered output is not the recorded success: %s", o.Data)
			}
		}
		if len(asked) != 0 {
			t.Fatalf("within the duplicate window the results were read: %q", asked)
		}
		// Past the window, only when the result is missing.
		a.RecoverEndings(time.Now(), time.Nanosecond, published(true))
		if outs, err := a.Process(again, redriven()); err != nil || len(outs) != 0 {
			t.Fatalf("a result already stored was published again: %q, %v", subjectsOf(outs), err)
		}
		if len(asked) != 1 || asked[0] != subjects.Result("acme", "", "i-1") {
			t.Fatalf("asked %q", asked)
		}
		a.RecoverEndings(time.Now(), time.Nanosecond, published(false))
		if outs, err := a.Process(again, redriven()); err != nil || len(outs) != 2 {
			t.Fatalf("a missing result was not published again: %q, %v", subjectsOf(outs), err)
		}
		// An ending recorded after the restart kept its message: a second
		// ending is dropped as ever.
		a.RecoverEndings(time.Now().Add(-time.Hour), time.Minute, published(false))
		if outs, err := a.Process(again, redriven()); err != nil || len(outs) != 0 {
			t.Fatalf("second ending after the restart published %q, %v", subjectsOf(outs), err)
		}
		if rec := st.records["i-1"]; rec.Status != api.StatusSuccess {
			t.Fatalf("stored %+v", rec)
		}
	})

	t.Run("status store down is transient", func(t *testing.T) {
		st := newFakeStore()
		st.statusEr = errors.New("kv down")
		_, err := (&Auditor{store: st}).Process(ctx, succeeded())
		if _, ok := stages.IsTransient(err); !ok {
			t.Fatalf("err %v, want transient", err)
		}
	})

	t.Run("usage is charged once per invocation", func(t *testing.T) {
		st := newFakeStore()
		a := &Auditor{store: st}
		for range 2 { // a redelivery charges nothing more
			if _, err := a.Process(ctx, admitted(succeeded())); err != nil {
				t.Fatal(err)
			}
		}
		u := st.usage["acme/s"]
		if u.RuntimeMS != 40 || u.Cost != 0.5 || u.ConsecutiveFailures != 0 || len(u.Settled) != 1 {
			t.Fatalf("usage %+v", u)
		}
		failed := admitted(&envelope.Invocation{ID: "i-4", Tenant: "acme", Status: api.StatusPending})
		failed.Fail(subjects.Execute, errors.New("boom"))
		if _, err := a.Process(ctx, failed); err != nil {
			t.Fatal(err)
		}
		if u := st.usage["acme/s"]; u.ConsecutiveFailures != 1 || u.RuntimeMS != 80 {
			t.Fatalf("after a failure: %+v", u)
		}
		// A caller sees the end in the status record: by then the failure
		// counts, so its next call is judged with it.
		if u := st.atEnd["i-4"]["acme/s"]; u.ConsecutiveFailures != 1 || !u.HasSettled("i-4") {
			t.Fatalf("usage when the failure's status was written: %+v", u)
		}
	})

	t.Run("never admitted: nothing charged", func(t *testing.T) {
		st := newFakeStore()
		if _, err := (&Auditor{store: st}).Process(ctx, succeeded()); err != nil {
			t.Fatal(err)
		}
		if len(st.usage) != 0 {
			t.Fatalf("charged %+v", st.usage)
		}
	})

	t.Run("admitted without a budget: nothing charged", func(t *testing.T) {
		st := newFakeStore()
		inv := admitted(succeeded())
		inv.Authz.Unmetered = true
		if _, err := (&Auditor{store: st}).Process(ctx, inv); err != nil {
			t.Fatal(err)
		}
		if len(st.usage) != 0 {
			t.Fatalf("charged %+v", st.usage)
		}
	})
}

type recorded struct {
	tool    string
	success bool
	ms      int64
	cost    float64
}

type fakeStats struct{ calls []recorded }

func (f *fakeStats) Record(_ context.Context, tool string, success bool, ms int64, cost float64) error {
	f.calls = append(f.calls, recorded{tool, success, ms, cost})
	return nil
}

func (f *fakeStats) Flush(context.Context) error { return nil }

// TestAuditCountsToolCalls: a call that reached its tool is counted once,
// with its outcome, duration and cost; a redelivery adds nothing, nor does
// a call refused before it ran.
func TestAuditCountsToolCalls(t *testing.T) {
	ctx := context.Background()
	stats := &fakeStats{}
	a := &Auditor{store: newFakeStore(), stats: stats}
	ran := &envelope.Invocation{ID: "i-1", Tenant: "acme", Event: envelope.Event{Seq: 1}, Status: api.StatusPending,
		Request: &api.Request{ToolID: "echo"}}
	ran.Authz = &envelope.Authorization{Session: "s", Reserved: true, CostPerCall: 0.25}
	ran.Metadata.DurationMS, ran.Metadata.StartedAt = 40, "2026-01-01T00:00:00Z"
	ran.Fail(subjects.Execute, api.NewError(api.ToolExecutionError, api.EToolFailed, "boom"))
	refused := &envelope.Invocation{ID: "i-2", Tenant: "acme", Event: envelope.Event{Seq: 2}, Status: api.StatusPending,
		Request: &api.Request{ToolID: "echo"}}
	refused.Fail(subjects.Authorize, api.NewError(api.PermissionDenied, api.EPolicyDenied, "no"))
	for _, inv := range []*envelope.Invocation{ran, ran, refused} {
		if _, err := a.Process(ctx, inv); err != nil {
			t.Fatal(err)
		}
	}
	want := []recorded{{"echo", false, 40, 0.25}}
	if len(stats.calls) != 1 || stats.calls[0] != want[0] {
		t.Fatalf("recorded %+v, want %+v", stats.calls, want)
	}
}

// TestSweptEndingOverALiveRecord: an E3901 a sweep of left-behind messages
// decided is refused while the record says a worker holds the invocation
// (parked, running): no event, no status, no charge. Over a pending
// record it ends the call, and the advisory's E3901 (no sweep) always does.
func TestSweptEndingOverALiveRecord(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		held   api.Status
		swept  bool
		refuse bool
	}{
		{"parked, swept", api.StatusPendingApproval, true, true},
		{"running, swept", api.StatusRunning, true, true},
		{"pending, swept", api.StatusPending, true, false},
		{"running, from the advisory", api.StatusRunning, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := newFakeStore()
			st.records["i-9"] = api.Record{InvocationID: "i-9", Tenant: "acme", Status: c.held, Seq: 4}
			inv := &envelope.Invocation{ID: "i-9", Tenant: "acme", Event: envelope.Event{Seq: 4}, Status: api.StatusPending,
				Authz: &envelope.Authorization{Session: "s", Reserved: true, CostPerCall: 1}}
			inv.Metadata.StartedAt = "2026-01-01T00:00:00Z"
			e := api.NewError(api.InternalError, api.EDeliveryExhausted, "left behind")
			if c.swept {
				e = e.WithDetail(stages.SweptDetail, true)
			}
			// Through JSON, as it travels.
			data, _ := json.Marshal(e)
			var wire api.Error
			if err := json.Unmarshal(data, &wire); err != nil {
				t.Fatal(err)
			}
			inv.Fail(subjects.Route, &wire)
			outs, err := (&Auditor{store: st}).Process(ctx, inv)
			if err != nil {
				t.Fatal(err)
			}
			refused := len(outs) == 0 && st.records["i-9"].Status == c.held && len(st.usage) == 0
			if refused != c.refuse {
				t.Fatalf("refused %v, want %v (outputs %d, record %+v, usage %v)", refused, c.refuse, len(outs), st.records["i-9"], st.usage)
			}
		})
	}
}
