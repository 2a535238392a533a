package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/subjects"
)

// TestCustodyIsTheHolders: every stage may read TOOLGATE_PIPELINE by
// sequence (its sweep), so while execute runs a call, the hop route handed
// it sits there for any of them to read. A compromised verify (or control)
// host copies the custody from that hop and hands audit an ending of the
// running call as its own; audit refuses it (E3230), because the custody
// names the stage that holds the call, and the call ends as its tool says.
// The forgery takes the hop's predictable id first: the real ending, whose
// id carries its sender's tag, still gets through.
func TestCustodyIsTheHolders(t *testing.T) {
	s := serveEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	trail, err := ojs.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	tenant := s.tenant("custody")
	nc, raw := s.agent(t, 0, tenant)
	agent, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		role busauth.Role
		end  func(inv *envelope.Invocation)
	}{
		{"verify ends a call execute runs with a forged success", busauth.RoleVerify, func(inv *envelope.Invocation) {
			inv.Succeed(subjects.Verify, json.RawMessage(`{"slept_ms":"forged"}`))
		}},
		{"control cancels a call execute runs", busauth.RoleControl, func(inv *envelope.Invocation) {
			inv.Fail(subjects.Authorize, api.NewError(api.Cancelled, api.ECancelled, "forged cancel"))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			js, _ := jetstream.New(s.connect(t, 0, s.creds(tc.role)))
			pipe, err := js.Stream(ctx, subjects.StreamPipeline)
			if err != nil {
				t.Fatalf("%s reading %s: %v", tc.role, subjects.StreamPipeline, err)
			}
			id, err := agent.Invoke(ctx, api.Request{ToolID: "sleep", Parameters: json.RawMessage(`{"ms":3000}`),
				AgentContext: api.AgentContext{AgentDID: "did:agent:" + tenant, TenantID: tenant}, CapabilityToken: raw},
				client.InvokeOptions{ID: fmt.Sprintf("custody-%s-%d", tc.role, time.Now().UnixNano())})
			if err != nil {
				t.Fatal(err)
			}
			// The role's own credentials read the hop to execute while
			// execute runs the call.
			var held envelope.Invocation
			eventually(t, 30*time.Second, "the hop to execute in "+subjects.StreamPipeline, func() bool {
				m, err := pipe.GetLastMsgForSubject(ctx, subjects.Pipe(subjects.Execute, subjects.PriorityNormal, tenant))
				return err == nil && json.Unmarshal(m.Data, &held) == nil && held.ID == id
			})
			if held.Custody == "" {
				t.Fatal("the hop to execute carries no custody")
			}
			tc.end(&held)
			hop, err := runner.Handoff(&held, subjects.Audit)
			if err != nil {
				t.Fatal(err)
			}
			// Under the id the real ending would have without its
			// sender's tag (runner.EndingID): JetStream keeps the first
			// message of an id, so taking it first would make audit's
			// input drop the real ending, and the call would never end.
			if err := runner.Publish(ctx, s.signedAs(t, tc.role), hop); err != nil {
				t.Fatalf("%s handing audit an ending: %v", tc.role, err)
			}
			wctx, wcancel := context.WithTimeout(ctx, time.Minute)
			defer wcancel()
			r, err := agent.Wait(wctx, tenant, id)
			if err != nil {
				t.Fatalf("the call %s did not end: the forgery under its ending's id made the stream drop the real ending? %v", id, err)
			}
			if r.Status != api.StatusSuccess || !strings.Contains(string(r.Result), "3000") {
				t.Fatalf("the call %s ended %s %s %+v: %s's copied custody ended it", id, r.Status, r.Result, r.Error, tc.role)
			}
			eventually(t, 20*time.Second, "a poison event with E3230 for the copied custody", func() bool {
				m, err := trail.GetLastMsgForSubject(ctx, subjects.AuditEvent(tenant, envelope.SubjectSuffix(api.TypePoison)))
				return err == nil && strings.Contains(string(m.Data), id) && strings.Contains(string(m.Data), api.EEndingRefused)
			})
		})
	}
}

// TestRefusalGoesToTheRequester: agent B invokes with its own token and
// connection a call whose request names agent A. The call is refused, and
// the refusal is B's: it ends on B's result subject and B's status of it
// is answered; A, subscribed to its own results, receives nothing of it.
func TestRefusalGoesToTheRequester(t *testing.T) {
	s := serveEmbedded(t)
	a := s.agentAs(t, "did:agent:a", false)
	b := s.agentAs(t, "did:agent:b", false)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	aOwn, err := a.nc.SubscribeSync(subjects.ResultAgent("demo", a.did))
	if err != nil {
		t.Fatal(err)
	}
	_ = a.nc.Flush()
	id, err := b.c.Invoke(ctx, api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"as a"}`),
		AgentContext: api.AgentContext{AgentDID: a.did, TenantID: "demo"}, CapabilityToken: b.raw}, client.InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	r, err := b.c.Wait(wctx, "demo", id)
	if err != nil {
		rec, serr := s.node.Store.Status(ctx, "demo", id)
		t.Logf("DEBUG record %+v %v", rec, serr)
		t.Fatalf("B waiting on its own result subject for its refused call: %v", err)
	}
	if r.Status != api.StatusPermissionDenied || r.Error == nil || r.Error.ECode != api.ENotGranted {
		t.Fatalf("B's call naming A: %s %+v, want permission_denied %s", r.Status, r.Error, api.ENotGranted)
	}
	rec, err := b.c.Status(ctx, "demo", id)
	if err != nil || rec.Agent != b.did {
		t.Errorf("B's status of its refused call: %+v, %v", rec, err)
	}
	if _, err := a.c.Status(ctx, "demo", id); !errorHasCode(err, api.ENotOwnCall) {
		t.Errorf("A's status of B's refused call: %v, want %s", err, api.ENotOwnCall)
	}
	for {
		m, err := aOwn.NextMsg(2 * time.Second)
		if err != nil {
			break
		}
		if strings.Contains(string(m.Data), id) {
			t.Fatalf("A received B's refusal on %s: %s", m.Subject, m.Data)
		}
	}
}

// TestCancelBindsItsAgent: agent B cancels agent A's call before any
// stage has recorded it (so no record names its agent yet, and the
// control service takes the cancel). Execute honours a cancel only from
// the call's own agent (or a principal that sees every call): B's is
// ignored and audited (E3250), and A's call runs.
func TestCancelBindsItsAgent(t *testing.T) {
	s := serveEmbedded(t)
	a := s.agentAs(t, "did:agent:a", false)
	b := s.agentAs(t, "did:agent:b", false)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	trail, err := ojs.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	invoke := func(message string) string {
		id, err := a.c.Invoke(ctx, api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"` + message + `"}`),
			AgentContext: api.AgentContext{AgentDID: a.did, TenantID: "demo"}, CapabilityToken: a.raw}, client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	// A's target waits behind a burst of its calls at validate, so B's
	// cancel reaches it before any stage records it.
	target := ""
	for attempt := 0; attempt < 5 && target == ""; attempt++ {
		for i := range 15 {
			invoke(fmt.Sprintf("before-%d-%d", attempt, i))
		}
		id := invoke("mine")
		if _, err := b.c.Cancel(ctx, "demo", id, "not mine to cancel"); err == nil {
			target = id
		} else if !errorHasCode(err, api.ENotOwnCall) {
			t.Fatalf("B's cancel of A's unrecorded call: %v", err)
		}
	}
	if target == "" {
		t.Skip("validate recorded every target before B's cancel reached it")
	}
	r, err := a.c.Wait(ctx, "demo", target)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != api.StatusSuccess || !strings.Contains(string(r.Result), "mine") {
		t.Fatalf("A's call %s ended %s %+v: B's cancel of it was honoured", target, r.Status, r.Error)
	}
	eventually(t, 20*time.Second, "a state.refused event with "+api.ECancelNotOwn+" for B's cancel", func() bool {
		m, err := trail.GetLastMsgForSubject(ctx, subjects.AuditEvent(subjects.SystemTenant, envelope.SubjectSuffix(api.TypeStateRefused)))
		return err == nil && strings.Contains(string(m.Data), target) && strings.Contains(string(m.Data), api.ECancelNotOwn)
	})
	// A's own cancel of its unrecorded call is still honoured.
	own := ""
	for attempt := 0; attempt < 5 && own == ""; attempt++ {
		for i := range 15 {
			invoke(fmt.Sprintf("again-%d-%d", attempt, i))
		}
		id := invoke("cancel me")
		if rec, err := a.c.Cancel(ctx, "demo", id, "mine"); err == nil && rec.Seq == 0 {
			own = id
		}
	}
	if own == "" {
		t.Skip("validate recorded every call of A before its own cancel reached it")
	}
	if r, err := a.c.Wait(ctx, "demo", own); err != nil || r.Status != api.StatusCancelled {
		t.Fatalf("A's own cancel of its unrecorded call: %+v, %v", r, err)
	}
}
