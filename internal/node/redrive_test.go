package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// countTool counts its runs by parameters: a no-op that shows how often
// each call really ran.
const countTool = `{"id":"test.count","name":"count","version":"1.0.0","description":"counts its runs","kind":"builtin",
  "builtin":{"function":"count"},"input_schema":{"type":"object"},"output_schema":{"type":"object"},
  "circuit_breaker":{"failure_rate_threshold":50,"sliding_window_size":20,"minimum_calls":5,"wait_duration_seconds":30}}`

// redriveEnv is a pipeline with the count tool.
type redriveEnv struct {
	*env
	runs  sync.Map // parameters → *atomic.Int32
	total atomic.Int32
}

func newRedriveEnv(t *testing.T) *redriveEnv {
	e := &redriveEnv{env: newEnv(t, topology.TopologyOptions{})}
	set := e.builtins(t.TempDir())
	set["count"] = func(_ context.Context, p json.RawMessage) (json.RawMessage, error) {
		n, _ := e.runs.LoadOrStore(string(p), new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		e.total.Add(1)
		return json.RawMessage(`{}`), nil
	}
	n := e.startPipeline(node.Config{Stage: node.StageConfig{Builtins: set}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := n.Store.RegisterTool(ctx, []byte(countTool), true); err != nil {
		t.Fatal(err)
	}
	if err := n.WaitForTool(ctx, "test.count", "1.0.0"); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *redriveEnv) runsOf(params string) int32 {
	n, ok := e.runs.Load(params)
	if !ok {
		return 0
	}
	return n.(*atomic.Int32).Load()
}

// breaker forces test.count's breaker open or releases it, and waits until
// execute honours it.
func (e *redriveEnv) breaker(t *testing.T, tenant, state string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := e.client.SetBreaker(ctx, "test.count", state, "ops"); err != nil {
		t.Fatal(err)
	}
	probe := 0
	eventually(t, 15*time.Second, "execute to honour breaker "+state, func() bool {
		probe++
		r := e.invoke(request(tenant, "test.count", fmt.Sprintf(`{"probe":"%s-%d"}`, state, probe)))
		open := r.Error != nil && r.Error.ECode == api.EBreakerOpen
		return open == (state == api.BreakerOpen)
	})
}

// TestRedrive: calls that ended on an open breaker are kept without their
// token; re-driven after the breaker closes, each is a new invocation
// through every stage, linked to the original, run by whoever signed the
// run, while the original keeps its one terminal event. A re-drive whose
// token was revoked meanwhile is refused by authorize.
func TestRedrive(t *testing.T) {
	e := newRedriveEnv(t)
	const tenant = "rd"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	c := grant(tenant, "test.*")
	c.ID = "tok-rd-1"
	tok := mint(t, c)
	c2 := grant(tenant, "test.*")
	c2.ID = "tok-rd-revoked"
	c2.ExpiresAt = jwt.NewNumericDate(time.Now().Add(time.Hour))
	tok2 := mint(t, c2)

	e.breaker(t, tenant, api.BreakerOpen)
	first := e.invoke(withTok(request(tenant, "test.count", `{"n":"first"}`), tok))
	if first.Error == nil || first.Error.ECode != api.EBreakerOpen {
		t.Fatalf("with the breaker open: %+v, want %s", first, api.EBreakerOpen)
	}
	second := e.invoke(withTok(request(tenant, "test.count", `{"n":"revoked"}`), tok2))
	if second.Error == nil || second.Error.ECode != api.EBreakerOpen {
		t.Fatalf("with the breaker open: %+v, want %s", second, api.EBreakerOpen)
	}
	fourth := e.invoke(withTok(request(tenant, "test.count", `{"n":"revoked"}`), tok2))
	if fourth.Error == nil || fourth.Error.ECode != api.EBreakerOpen {
		t.Fatalf("with the breaker open: %+v, want %s", fourth, api.EBreakerOpen)
	}
	third := e.invoke(withTok(request(tenant, "test.count", `{"n":"decision"}`), tok))
	if third.Error == nil || third.Error.ECode != api.EBreakerOpen {
		t.Fatalf("with the breaker open: %+v, want %s", third, api.EBreakerOpen)
	}
	// A failure that would fail again is not kept.
	bad := e.invoke(withTok(request(tenant, "test.boom", `{}`), tok))
	if bad.Status == api.StatusSuccess {
		t.Fatalf("boom succeeded: %+v", bad)
	}

	// The dead letters hold the request, never the token.
	eventually(t, 10*time.Second, "the dead letters to be kept", func() bool {
		l, err := e.client.RedriveList(ctx, api.RedriveListRequest{RedriveFilter: api.RedriveFilter{Tenant: tenant, Code: api.EBreakerOpen}})
		return err == nil && len(l.Entries) >= 2
	})
	for _, m := range e.read(subjects.StreamDeadLetter, subjects.DeadLetterTenant(tenant), 1, 10*time.Second) {
		if s := string(m.Data()); strings.Contains(s, tok) || strings.Contains(s, tok2) || strings.Contains(s, "tgsealed1.") ||
			strings.Contains(s, "capability_token") {
			t.Fatalf("a dead letter holds a token: %s", s)
		}
	}
	if _, err := e.client.RedriveShow(ctx, tenant, bad.InvocationID); !isCode(err, api.EInvocationNotFound) {
		t.Fatalf("show of a call that panicked: %v, want %s (not kept)", err, api.EInvocationNotFound)
	}
	shown, err := e.client.RedriveShow(ctx, tenant, first.InvocationID)
	if err != nil || shown.Error == nil || shown.Error.ECode != api.EBreakerOpen || shown.ToolID != "test.count" ||
		shown.RedriveID != subjects.RedriveID(first.InvocationID, 1) || shown.RedriveStatus != "" {
		t.Fatalf("show: %+v %v", shown, err)
	}

	if _, err := e.client.RevokeToken(ctx, c2.ID, time.Now().Add(time.Hour), "leaked", "ops"); err != nil {
		t.Fatal(err)
	}
	e.breaker(t, tenant, api.BreakerRelease)
	before := e.runsOf(`{"n":"first"}`)

	t.Run("a breaker-open failure re-driven after the breaker closes succeeds", func(t *testing.T) {
		// Neither without a token nor with a decision but no reason.
		if _, err := e.client.RedriveRun(ctx, api.RedriveRunRequest{Tenant: tenant, IDs: []string{first.InvocationID}}, ""); !isCode(err, api.ERequestInvalid) {
			t.Fatalf("without a token: %v, want %s", err, api.ERequestInvalid)
		}
		out, err := e.client.RedriveRun(ctx, api.RedriveRunRequest{Tenant: tenant, IDs: []string{first.InvocationID}, By: "alice"}, tok)
		if err != nil || len(out.Runs) != 1 || out.Runs[0].Error != nil {
			t.Fatalf("run: %+v %v", out, err)
		}
		id := out.Runs[0].RedriveID
		resp, err := e.client.Wait(ctx, tenant, id)
		if err != nil || resp.Status != api.StatusSuccess {
			t.Fatalf("the re-drive: %+v %v", resp, err)
		}
		if got := e.runsOf(`{"n":"first"}`); got != before+1 {
			t.Fatalf("the tool ran %d times more, want 1", got-before)
		}
		// Through every stage, linked to the original and run by alice.
		hops := []string{}
		for _, h := range resp.ExecutionMetadata.Stages {
			hops = append(hops, h.Stage)
		}
		for _, st := range []string{subjects.Validate, subjects.Authorize, subjects.Route, subjects.Execute} {
			if !slices.Contains(hops, st) {
				t.Fatalf("stages %v: no %s", hops, st)
			}
		}
		succeeded := subjects.AuditEvent(tenant, "tool.succeeded")
		evs := e.read(subjects.StreamAudit, succeeded, e.count(subjects.StreamAudit, succeeded), 10*time.Second)
		found := false
		for _, m := range evs {
			s := string(m.Data())
			found = found || (strings.Contains(s, `"`+id+`"`) && strings.Contains(s, `"original":"`+first.InvocationID+`"`) && strings.Contains(s, `"by":"alice"`))
		}
		if !found {
			t.Fatalf("no tool.succeeded of %s naming its original and alice", id)
		}
		// The original keeps its one terminal event and its status.
		if n := terminalEvents(t, e.env, tenant, first.InvocationID); n != 1 {
			t.Fatalf("the original has %d terminal events, want 1", n)
		}
		if rec, err := e.client.Status(ctx, tenant, first.InvocationID); err != nil || rec.Error == nil || rec.Error.ECode != api.EBreakerOpen {
			t.Fatalf("the original's record: %+v %v", rec, err)
		}
		// Listed with what became of it.
		l, err := e.client.RedriveList(ctx, api.RedriveListRequest{RedriveFilter: api.RedriveFilter{Tenant: tenant}})
		ok := false
		for _, en := range l.Entries {
			ok = ok || (en.InvocationID == first.InvocationID && en.RedriveStatus == api.StatusSuccess)
		}
		if err != nil || !ok {
			t.Fatalf("list after the run: %+v %v", l, err)
		}
		// Run again: skipped, its re-drive has a record; and published
		// again past control, as two runs at once would, validate refuses
		// it as a duplicate. The tool does not run again.
		again, err := e.client.RedriveRun(ctx, api.RedriveRunRequest{Tenant: tenant, IDs: []string{first.InvocationID}}, tok)
		if err != nil || len(again.Runs) != 1 || !isCode(again.Runs[0].Error, api.EDuplicateInvocation) {
			t.Fatalf("second run: %+v %v, want %s", again, err, api.EDuplicateInvocation)
		}
		dup := request(tenant, "test.count", `{"n":"first"}`)
		dup.Redrive = &api.Redrive{Original: first.InvocationID, Root: first.InvocationID, Depth: 1, By: "alice"}
		if _, err := e.client.Invoke(ctx, dup, client.InvokeOptions{ID: id}); err != nil {
			t.Fatal(err)
		}
		e.read(subjects.StreamAudit, subjects.AuditEvent(tenant, "tool.duplicate"), 1, 10*time.Second)
		if got := e.runsOf(`{"n":"first"}`); got != before+1 {
			t.Fatalf("a second run ran the tool again (%d)", got-before)
		}
	})

	t.Run("an operator's decision re-drives without the caller's token", func(t *testing.T) {
		out, err := e.client.RedriveRun(ctx, api.RedriveRunRequest{Tenant: tenant, IDs: []string{third.InvocationID},
			Decision: true, Reason: "the provider is back", By: "bob"}, "")
		if err != nil || len(out.Runs) != 1 || out.Runs[0].Error != nil {
			t.Fatalf("run: %+v %v", out, err)
		}
		resp, err := e.client.Wait(ctx, tenant, out.Runs[0].RedriveID)
		if err != nil || resp.Status != api.StatusSuccess || e.runsOf(`{"n":"decision"}`) != 1 {
			t.Fatalf("the re-drive: %+v %v", resp, err)
		}
		rd := resp.ExecutionMetadata.Redrive
		if rd == nil || rd.Original != third.InvocationID || rd.By != "bob" || !rd.Decision || rd.Reason != "the provider is back" {
			t.Fatalf("the re-drive's metadata: %+v", rd)
		}
		// Recorded: the run is an audited admin event naming the operator.
		found := false
		for _, m := range e.read(subjects.StreamAudit, subjects.AuditEvent(subjects.SystemTenant, "admin.redrive.run"),
			e.count(subjects.StreamAudit, subjects.AuditEvent(subjects.SystemTenant, "admin.redrive.run")), 10*time.Second) {
			s := string(m.Data())
			found = found || (strings.Contains(s, `"by":"bob"`) && strings.Contains(s, `"authority":"decision"`) &&
				strings.Contains(s, third.InvocationID))
		}
		if !found {
			t.Fatal("no admin.redrive.run event naming bob's decision")
		}
	})

	t.Run("a re-drive whose token was revoked is refused", func(t *testing.T) {
		out, err := e.client.RedriveRun(ctx, api.RedriveRunRequest{Tenant: tenant, IDs: []string{second.InvocationID}}, tok2)
		if err != nil || len(out.Runs) != 1 || out.Runs[0].Error != nil {
			t.Fatalf("run: %+v %v", out, err)
		}
		resp, err := e.client.Wait(ctx, tenant, out.Runs[0].RedriveID)
		if err != nil || resp.Status != api.StatusPermissionDenied || resp.Error.ECode != api.ETokenRevoked {
			t.Fatalf("the re-drive: %+v %v, want %s", resp, err, api.ETokenRevoked)
		}
		// The operator's decision does not pass a revocation either.
		d, err := e.client.RedriveRun(ctx, api.RedriveRunRequest{Tenant: tenant, IDs: []string{out.Runs[0].RedriveID, second.InvocationID, fourth.InvocationID},
			Decision: true, Reason: "provider back"}, "")
		if err != nil {
			t.Fatal(err)
		}
		// A refusal is no dead letter; the refused original was re-driven
		// already; the other call of the revoked token is started.
		if len(d.Runs) != 3 || !isCode(d.Runs[0].Error, api.EInvocationNotFound) || !isCode(d.Runs[1].Error, api.EDuplicateInvocation) ||
			d.Runs[2].Error != nil {
			t.Fatalf("decision run: %+v", d)
		}
		resp, err = e.client.Wait(ctx, tenant, d.Runs[2].RedriveID)
		if err != nil || resp.Status != api.StatusPermissionDenied || resp.Error.ECode != api.ETokenRevoked {
			t.Fatalf("a decision's re-drive of a revoked token's call: %+v %v, want %s", resp, err, api.ETokenRevoked)
		}
		if got := e.runsOf(`{"n":"revoked"}`); got != 0 {
			t.Fatalf("the revoked token's call ran %d times", got)
		}
	})
}

// TestRedriveBulk: 1,000 calls ended on an open breaker, re-driven by one
// filtered run once the breaker closed, each run exactly once, and a
// second run of the same filter starts none again.
func TestRedriveBulk(t *testing.T) {
	e := newRedriveEnv(t)
	const tenant, n = "rdbulk", 1000
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tok := tokenFor(tenant, "did:agent:test")
	e.breaker(t, tenant, api.BreakerOpen)
	since := time.Now()
	for i := range n {
		req := request(tenant, "test.count", fmt.Sprintf(`{"i":%d}`, i))
		if _, err := e.client.Invoke(ctx, req, client.InvokeOptions{ID: fmt.Sprintf("bulk-%04d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 3*time.Minute, "every call to be dead-lettered", func() bool {
		return e.count(subjects.StreamDeadLetter, subjects.DeadLetterTenant(tenant)) >= n
	})
	e.breaker(t, tenant, api.BreakerRelease)
	filter := &api.RedriveFilter{Tenant: tenant, Code: api.EBreakerOpen, Since: &since}
	l, err := e.client.RedriveList(ctx, api.RedriveListRequest{RedriveFilter: *filter, Limit: 2 * n})
	if err != nil || len(l.Entries) != n {
		t.Fatalf("list: %d entries, %v; want %d", len(l.Entries), err, n)
	}
	start := time.Now()
	out, err := e.client.RedriveRun(ctx, api.RedriveRunRequest{Tenant: tenant, Filter: filter}, tok)
	if err != nil || len(out.Runs) != n {
		t.Fatalf("run: %d runs, %v", len(out.Runs), err)
	}
	for _, r := range out.Runs {
		if r.Error != nil {
			t.Fatalf("run of %s: %v", r.Original, r.Error)
		}
	}
	for _, r := range out.Runs {
		resp, err := e.client.Wait(ctx, tenant, r.RedriveID)
		if err != nil || resp.Status != api.StatusSuccess {
			t.Fatalf("re-drive %s: %+v %v", r.RedriveID, resp, err)
		}
	}
	t.Logf("%d re-drives ended in %v", n, time.Since(start).Round(time.Millisecond))
	// Again: every re-drive id is taken, nothing runs twice.
	again, err := e.client.RedriveRun(ctx, api.RedriveRunRequest{Tenant: tenant, Filter: filter}, tok)
	if err != nil || len(again.Runs) != n {
		t.Fatalf("second run: %d runs, %v", len(again.Runs), err)
	}
	for _, r := range again.Runs {
		if !isCode(r.Error, api.EDuplicateInvocation) {
			t.Fatalf("second run of %s: %+v, want %s", r.Original, r.Error, api.EDuplicateInvocation)
		}
	}
	time.Sleep(time.Second) // anything started by mistake would have run by now
	for i := range n {
		if got := e.runsOf(fmt.Sprintf(`{"i":%d}`, i)); got != 1 {
			t.Fatalf("call %d ran %d times, want once", i, got)
		}
	}
}

// terminalEvents counts the terminal audit events of invocation id.
func terminalEvents(t *testing.T, e *env, tenant, id string) int {
	t.Helper()
	n := 0
	for _, typ := range []string{"tool.succeeded", "tool.failed", "tool.timeout", "tool.cancelled", "tool.rejected", "tool.permission_denied"} {
		if e.count(subjects.StreamAudit, subjects.AuditEvent(tenant, typ)) == 0 {
			continue
		}
		for _, m := range e.read(subjects.StreamAudit, subjects.AuditEvent(tenant, typ), e.count(subjects.StreamAudit, subjects.AuditEvent(tenant, typ)), 10*time.Second) {
			var ev struct {
				Subject string `json:"subject"`
			}
			if json.Unmarshal(m.Data(), &ev) == nil && ev.Subject == id {
				n++
			}
		}
	}
	return n
}

func isCode(err error, ecode string) bool {
	var te *api.Error
	if err == nil {
		return false
	}
	if e, ok := err.(*api.Error); ok {
		te = e
	}
	return te != nil && te.ECode == ecode
}
