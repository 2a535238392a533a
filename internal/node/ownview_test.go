package node_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/subjects"
)

// viewerAgent is one agent of tenant demo connected with its own token.
type viewerAgent struct {
	did string
	raw string
	nc  *nats.Conn
	c   *client.Agent
}

func (s *served) agentAs(t *testing.T, did string, reader bool) viewerAgent {
	t.Helper()
	raw, cl := agentToken(t, "demo", func(c *token.Claims) { c.AgentDID, c.TenantReader = did, reader })
	nc := s.connect(t, 0, nats.Token(raw), nats.CustomInboxPrefix(busauth.InboxPrefix("demo", cl.ID)))
	c, err := client.NewAgent(nc)
	if err != nil {
		t.Fatal(err)
	}
	// A tenant reader's client reads every agent's results; another
	// agent's its own only.
	if want := map[bool]string{false: did}[reader]; c.AgentDID != want {
		t.Fatalf("NewAgent took agent %q from the token, want %q", c.AgentDID, want)
	}
	return viewerAgent{did: did, raw: raw, nc: nc, c: c}
}

// invokeEcho has a call echo message and returns its id once it ended.
func (a viewerAgent) invokeEcho(t *testing.T, message string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"` + message + `"}`),
		AgentContext: api.AgentContext{AgentDID: a.did, TenantID: "demo"}, CapabilityToken: a.raw}
	id, err := a.c.Invoke(ctx, req, client.InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := a.c.Wait(ctx, "demo", id)
	if err != nil || resp.Status != api.StatusSuccess {
		t.Fatalf("%s's call: %+v, %v", a.did, resp, err)
	}
	return id
}

// history is every stored audit event of demo a's token is answered.
func (a viewerAgent) history(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var all strings.Builder
	r := api.AuditHistoryRequest{PageSize: 200}
	for {
		page, err := a.c.AuditHistory(ctx, "demo", r)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Events {
			all.Write(e.Event)
		}
		if !page.More {
			return all.String()
		}
		r.Cursor = page.NextCursor
	}
}

// TestAgentSeesOnlyItsOwnCalls: agents A and B of tenant demo, and a
// tenant reader, on the authenticated embedded bus. B's status, approval,
// cancel, checkpoint and audit history requests never show A's call; A
// sees its own; the reader sees both.
func TestAgentSeesOnlyItsOwnCalls(t *testing.T) {
	s := serveEmbedded(t)
	a := s.agentAs(t, "did:agent:a", false)
	b := s.agentAs(t, "did:agent:b", false)
	reader := s.agentAs(t, "did:agent:auditor", true)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Wildcard subscriptions over the tenant's results and audit, made
	// before the calls: B's must carry none of A's, the reader's carry both.
	watch := func(nc *nats.Conn, subject string) *nats.Subscription {
		sub, err := nc.SubscribeSync(subject)
		if err != nil {
			t.Fatal(err)
		}
		return sub
	}
	bResults, bAudit := watch(b.nc, "tool.result.demo.>"), watch(b.nc, "audit.demo.>")
	rResults := watch(reader.nc, "tool.result.demo.>")
	aOwn := watch(a.nc, subjects.ResultAgent("demo", a.did))
	for _, nc := range []*nats.Conn{a.nc, b.nc, reader.nc} {
		_ = nc.Flush()
	}

	idA := a.invokeEcho(t, "secret of a")
	idB := b.invokeEcho(t, "note of b")

	// seen reads what sub got until it has been quiet for a while.
	seen := func(sub *nats.Subscription) string {
		var all strings.Builder
		for {
			m, err := sub.NextMsg(time.Second)
			if err != nil {
				return all.String()
			}
			all.WriteString(m.Subject + " " + string(m.Data) + "\n")
		}
	}
	t.Run("wildcard subscriptions", func(t *testing.T) {
		if got := seen(bResults); strings.Contains(got, idA) || strings.Contains(got, "secret of a") {
			t.Errorf("B's subscription to tool.result.demo.> carried A's result:\n%s", got)
		}
		if got := seen(bAudit); strings.Contains(got, idA) {
			t.Errorf("B's subscription to audit.demo.> carried A's audit events:\n%s", got)
		}
		if got := seen(aOwn); !strings.Contains(got, "secret of a") || strings.Contains(got, idB) {
			t.Errorf("A's own results: %s", got)
		}
		if got := seen(rResults); !strings.Contains(got, idA) || !strings.Contains(got, idB) {
			t.Errorf("the reader's subscription lacks a result: %s", got)
		}
	})
	t.Run("direct get", func(t *testing.T) {
		get := func(nc *nats.Conn, subject string) (string, error) {
			m, err := nc.Request("$JS.API.DIRECT.GET."+subjects.StreamResults+"."+subject, nil, 2*time.Second)
			if err != nil {
				return "", err
			}
			return string(m.Data), nil
		}
		if got, err := get(b.nc, subjects.Result("demo", a.did, idA)); err == nil {
			t.Errorf("B's direct get of A's result answered: %s", got)
		}
		if got, err := get(a.nc, subjects.Result("demo", a.did, idA)); err != nil || !strings.Contains(got, "secret of a") {
			t.Errorf("A's direct get of its result: %q, %v", got, err)
		}
		if got, err := get(reader.nc, subjects.Result("demo", a.did, idA)); err != nil || !strings.Contains(got, "secret of a") {
			t.Errorf("the reader's direct get of A's result: %q, %v", got, err)
		}
	})
	// A checkpoint of A's call, as execute stores one.
	cp, err := s.node.Store.SaveCheckpoint(ctx, api.Checkpoint{Kind: api.CheckpointNamed, Name: "n", Tenant: "demo",
		InvocationID: idA, Seq: 1}, json.RawMessage(`{"state":"of a"}`), nil)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("status", func(t *testing.T) {
		if _, err := b.c.Status(ctx, "demo", idA); !errorHasCode(err, api.ENotOwnCall) {
			t.Errorf("B's status of A's call: %v, want E3260", err)
		}
		if rec, err := a.c.Status(ctx, "demo", idA); err != nil || rec.Agent != a.did {
			t.Errorf("A's status of its call: %+v, %v", rec, err)
		}
		for _, id := range []string{idA, idB} {
			if _, err := reader.c.Status(ctx, "demo", id); err != nil {
				t.Errorf("the reader's status of %s: %v", id, err)
			}
		}
	})
	t.Run("cancel", func(t *testing.T) {
		if _, err := b.c.Cancel(ctx, "demo", idA, "not mine"); !errorHasCode(err, api.ENotOwnCall) {
			t.Errorf("B's cancel of A's call: %v, want E3260", err)
		}
	})
	t.Run("checkpoints", func(t *testing.T) {
		if _, err := b.c.Checkpoint(ctx, "demo", cp.ID, true); !errorHasCode(err, api.ENotOwnCall) {
			t.Errorf("B's get of A's checkpoint: %v, want E3260", err)
		}
		if _, err := b.c.DeleteCheckpoint(ctx, "demo", cp.ID); !errorHasCode(err, api.ENotOwnCall) {
			t.Errorf("B's delete of A's checkpoint: %v, want E3260", err)
		}
		if list, err := b.c.Checkpoints(ctx, "demo", ""); err != nil || len(list) != 0 {
			t.Errorf("B's list of the tenant's checkpoints: %+v, %v, want none", list, err)
		}
		if got, err := a.c.Checkpoint(ctx, "demo", cp.ID, true); err != nil || !strings.Contains(string(got.State), "of a") {
			t.Errorf("A's get of its checkpoint: %+v, %v", got, err)
		}
		if list, err := reader.c.Checkpoints(ctx, "demo", ""); err != nil || len(list) != 1 {
			t.Errorf("the reader's list: %+v, %v, want A's checkpoint", list, err)
		}
	})
	t.Run("audit history", func(t *testing.T) {
		if h := b.history(t); strings.Contains(h, idA) || !strings.Contains(h, idB) {
			t.Errorf("B's history names A's call %s: %v; or lacks its own %s: %v", idA, strings.Contains(h, idA), idB, !strings.Contains(h, idB))
		}
		if h := a.history(t); !strings.Contains(h, idA) || strings.Contains(h, idB) {
			t.Errorf("A's history: has its own %v, has B's %v", strings.Contains(h, idA), strings.Contains(h, idB))
		}
		if h := reader.history(t); !strings.Contains(h, idA) || !strings.Contains(h, idB) {
			t.Errorf("the reader's history lacks a call: A's %v, B's %v", strings.Contains(h, idA), strings.Contains(h, idB))
		}
	})
	t.Run("the refusal is audited", func(t *testing.T) {
		js, err := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "a view.refused audit event naming B and A's call", func() bool {
			st, err := js.Stream(ctx, subjects.StreamAudit)
			if err != nil {
				return false
			}
			m, err := st.GetLastMsgForSubject(ctx, subjects.AuditEvent(subjects.SystemTenant, "view.refused"))
			return err == nil && strings.Contains(string(m.Data), "did=3Aagent=3Ab") && strings.Contains(string(m.Data), idA)
		})
	})
}
