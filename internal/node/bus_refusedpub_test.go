package node_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/subjects"
)

// refusalsAfter returns the data of the bus.refused audit events AUDIT
// stored after sequence after.
func refusalsAfter(ctx context.Context, js jetstream.JetStream, after uint64) ([]node.RefusalRecord, error) {
	c, err := js.OrderedConsumer(ctx, subjects.StreamAudit, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subjects.AuditEvent(subjects.SystemTenant, "bus.refused")},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy, OptStartSeq: after + 1,
	})
	if err != nil {
		return nil, err
	}
	batch, err := c.FetchNoWait(1000)
	if err != nil {
		return nil, err
	}
	var out []node.RefusalRecord
	for m := range batch.Messages() {
		var ev struct {
			Data node.RefusalRecord `json:"data"`
		}
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			return nil, err
		}
		out = append(out, ev.Data)
	}
	return out, batch.Error()
}

// refusedAfter reports whether a bus.refused event stored after sequence
// after has a reason containing all of want.
func refusedAfter(js jetstream.JetStream, after uint64, want ...string) bool {
	// Each probe has its own deadline: one shared by a whole table ran
	// out under load before its last rows.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	all, err := refusalsAfter(ctx, js, after)
	if err != nil {
		return false
	}
	for _, r := range all {
		b, _ := json.Marshal(r)
		found := true
		for _, w := range want {
			found = found && strings.Contains(string(b), w)
		}
		if found {
			return true
		}
	}
	return false
}

// refusalsOf returns the bus.refused events stored after sequence after
// for the credential of token id tokenID (none when AUDIT cannot be read).
func refusalsOf(js jetstream.JetStream, after uint64, tokenID string) []node.RefusalRecord {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	all, err := refusalsAfter(ctx, js, after)
	if err != nil {
		return nil
	}
	var out []node.RefusalRecord
	for _, r := range all {
		if r.TokenID == tokenID {
			out = append(out, r)
		}
	}
	return out
}

// auditLastSeq is the last sequence AUDIT holds.
func auditLastSeq(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	return st.CachedInfo().State.LastSeq
}

// refusedPublishesAudited: on the embedded server, a publish and a
// subscription an agent's permissions refuse are audited as the bus's
// refusal, naming the agent, its tenant and token, its connection and
// what was refused; repeated at once, they make no further event.
func refusedPublishesAudited(t *testing.T, s *served) {
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	from := auditLastSeq(t, ojs)
	raw, c := agentToken(t, "demo", nil)
	var told atomic.Int32
	nc := s.connect(t, 1, nats.Token(raw), nats.CustomInboxPrefix(busauth.InboxPrefix("demo", c.ID)),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) { told.Add(1) }))
	forged := subjects.Pipe(subjects.Execute, "", "demo")
	for range 20 {
		if err := nc.Publish(forged, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := nc.SubscribeSync(subjects.AuditEvent("other", ">")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	mine := func() []node.RefusalRecord { return refusalsOf(ojs, from, c.ID) }
	var got []node.RefusalRecord
	eventually(t, 10*time.Second, "a bus.refused event for the agent's refused publish", func() bool {
		got = mine()
		return len(got) > 0
	})
	r := got[0]
	if r.Role != string(busauth.RoleAgent) || r.Tenant != "demo" || r.ClientID == 0 ||
		!strings.Contains(r.Reason, busauth.ErrPermission.Error()) || !strings.Contains(r.Reason, forged) ||
		!strings.Contains(r.Reason, "not recorded") {
		t.Fatalf("refusal %+v: want the agent, its tenant and token, its connection and the refused subject", r)
	}
	// The other twenty refusals fall within the first one's window.
	time.Sleep(time.Second)
	if got = mine(); len(got) != 1 {
		t.Fatalf("%d bus.refused events for one credential's 21 refusals within a second, want 1: %+v", len(got), got)
	}
	if told.Load() == 0 {
		t.Fatal("the server told the client of no refusal")
	}
}

// agentWaitsUnrefused: an agent's SDK client, given only its token's
// connection, reads its own results: NewAgent takes the agent from the
// token, and Wait subscribes where the agent's permissions allow, so the
// bus refuses nothing. A subscription refused afterwards is then the
// credential's first refusal, and the one audited.
func agentWaitsUnrefused(t *testing.T, s *served) {
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	from := auditLastSeq(t, ojs)
	raw, c := agentToken(t, "demo", func(c *token.Claims) { c.AgentDID = "did:agent:waiter" })
	nc := s.connect(t, 1, nats.Token(raw), nats.CustomInboxPrefix(busauth.InboxPrefix("demo", c.ID)))
	a, err := client.NewAgent(nc)
	if err != nil {
		t.Fatal(err)
	}
	if a.AgentDID != c.AgentDID {
		t.Fatalf("NewAgent took agent %q from the token, want %q", a.AgentDID, c.AgentDID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := a.Invoke(ctx, api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"w"}`),
		AgentContext: api.AgentContext{AgentDID: c.AgentDID, TenantID: "demo"}, CapabilityToken: raw}, client.InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Wait under a context without a deadline, as a caller that waits as
	// long as the call takes has: the test bounds it from outside.
	type waited struct {
		resp api.Response
		err  error
	}
	done := make(chan waited, 1)
	go func() {
		resp, err := a.Wait(context.Background(), "demo", id)
		done <- waited{resp, err}
	}()
	select {
	case w := <-done:
		if w.err != nil || w.resp.Status != api.StatusSuccess {
			t.Fatalf("Wait: %+v, %v", w.resp, w.err)
		}
	case <-ctx.Done():
		t.Fatal("Wait did not return")
	}
	refused := subjects.AuditEvent("other", ">")
	if _, err := nc.SubscribeSync(refused); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var mine []node.RefusalRecord
	eventually(t, 10*time.Second, "a bus.refused event for the agent's refused subscription", func() bool {
		mine = refusalsOf(ojs, from, c.ID)
		return len(mine) > 0
	})
	if !strings.Contains(mine[0].Reason, refused) {
		t.Fatalf("the agent's first refusal was %q, not its subscription to %s: Wait was refused", mine[0].Reason, refused)
	}
}
