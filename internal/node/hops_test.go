package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/subjects"
)

// TestHopsFromTheirStage holds a compromised worker host to its role, with
// its own credentials and its own signing key, on the authenticated bus:
// it cannot end a call it never held (so a tenant's next call under that id
// is not refused as a duplicate), and audit relays none of its events under
// a type or source its role does not emit.
func TestHopsFromTheirStage(t *testing.T) {
	s := serveEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	trail, err := ojs.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	signed := func(role busauth.Role) jetstream.JetStream { return s.signedAs(t, role) }
	poisoned := func(tenant, subject, code, stage string) bool {
		m, err := trail.GetLastMsgForSubject(ctx, subjects.AuditEvent(tenant, envelope.SubjectSuffix(api.TypePoison)))
		return err == nil && strings.Contains(string(m.Data), subject) && strings.Contains(string(m.Data), code) &&
			strings.Contains(string(m.Data), `"stage":"`+stage+`"`)
	}

	// An ending written by a stage after authorize, or by control, for an
	// invocation id no stage has seen yet: audit refuses it (E3230), and the
	// tenant's own call under that id runs.
	endings := []struct {
		name string
		role busauth.Role
		end  func(inv *envelope.Invocation)
	}{
		{"execute ends a call it never received", busauth.RoleExecute, func(inv *envelope.Invocation) {
			inv.Fail(subjects.Execute, api.NewError(api.ToolExecutionError, api.EOutcomeUnknown, "forged ending"))
		}},
		{"execute poses as validate's refusal", busauth.RoleExecute, func(inv *envelope.Invocation) {
			inv.Fail(subjects.Validate, api.NewError(api.InvalidParameters, api.EParametersInvalid, "forged refusal"))
		}},
		{"execute ends a call as verify would", busauth.RoleExecute, func(inv *envelope.Invocation) {
			inv.Succeed(subjects.Verify, json.RawMessage(`{"echo":"forged"}`))
		}},
		{"control denies an approval never asked for", busauth.RoleControl, func(inv *envelope.Invocation) {
			inv.Fail(subjects.Authorize, api.NewError(api.PermissionDenied, api.EApprovalDenied, "forged denial"))
		}},
		{"control cancels a call never parked", busauth.RoleControl, func(inv *envelope.Invocation) {
			inv.Fail(subjects.Authorize, api.NewError(api.Cancelled, api.ECancelled, "forged cancel"))
		}},
	}
	tenant := s.tenant("hopvictim")
	nc, raw := s.agent(t, 0, tenant)
	agent, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range endings {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("hop-%d-%d", i, time.Now().UnixNano())
			inv := &envelope.Invocation{ID: id, Tenant: tenant, Event: envelope.Event{ID: id, Source: "urn:forger", Seq: uint64(1e12) + uint64(time.Now().UnixNano()%1e9)},
				ReceivedAt: time.Now(), Status: api.StatusPending,
				Request: &api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"forged"}`),
					AgentContext: api.AgentContext{AgentDID: "did:agent:" + tenant, TenantID: tenant}}}
			tc.end(inv)
			hop, err := runner.Handoff(inv, subjects.Audit)
			if err != nil {
				t.Fatal(err)
			}
			if err := runner.Publish(ctx, signed(tc.role), hop); err != nil {
				t.Fatalf("%s publishing onto %s: %v", tc.role, hop.Subject, err)
			}
			// Audit has taken the ending (the attack) or refused it.
			eventually(t, 30*time.Second, "audit to settle the forged ending", func() bool {
				_, err := s.node.Store.Status(ctx, tenant, id)
				return err == nil || poisoned(tenant, id, api.EEndingRefused, subjects.Audit)
			})
			got, err := agent.Invoke(ctx, api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"mine"}`),
				AgentContext: api.AgentContext{AgentDID: "did:agent:" + tenant, TenantID: tenant}, CapabilityToken: raw},
				client.InvokeOptions{ID: id})
			if err != nil {
				t.Fatal(err)
			}
			r, err := agent.Wait(ctx, tenant, got)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != api.StatusSuccess || !strings.Contains(string(r.Result), "mine") {
				t.Fatalf("the tenant's own call %s ended %s %s %+v: the forged ending took its id", id, r.Status, r.Result, r.Error)
			}
			if !poisoned(tenant, id, api.EEndingRefused, subjects.Audit) {
				t.Errorf("no poison event with %s for the forged ending of %s", api.EEndingRefused, id)
			}
		})
	}

	// An event a role relays under a subject it emits, but of a type (or
	// from a source) that subject does not carry: audit refuses it
	// (E3231, stage audit-relay) and publishes nothing of it.
	relays := []struct {
		name        string
		role        busauth.Role
		typ, source string
		tenant      string
		// subjectOfRelay is the subject audit would publish it on; the
		// role sends it on that subject's relay.
		subjectOfRelay string
	}{
		{name: "execute relays an approval as tool.invoked", role: busauth.RoleExecute, typ: api.TypeApprovalGranted,
			source: "urn:toolgate:authorize", tenant: "demo", subjectOfRelay: subjects.AuditEvent("demo", envelope.SubjectSuffix(api.TypeInvoked))},
		{name: "execute relays a success as tool.invoked", role: busauth.RoleExecute, typ: api.TypeSucceeded,
			source: "urn:toolgate:audit", tenant: "demo", subjectOfRelay: subjects.AuditEvent("demo", envelope.SubjectSuffix(api.TypeInvoked))},
		{name: "execute relays a policy push as tool.invoked", role: busauth.RoleExecute, typ: api.TypePolicyPushed,
			source: "urn:toolgate:control", tenant: "demo", subjectOfRelay: subjects.AuditEvent("demo", envelope.SubjectSuffix(api.TypeInvoked))},
		{name: "execute relays tool.invoked from another source", role: busauth.RoleExecute, typ: api.TypeInvoked,
			source: "urn:toolgate:verify", tenant: "demo", subjectOfRelay: subjects.AuditEvent("demo", envelope.SubjectSuffix(api.TypeInvoked))},
		{name: "execute relays tool.invoked of another tenant", role: busauth.RoleExecute, typ: api.TypeInvoked,
			source: "urn:toolgate:execute", tenant: "other", subjectOfRelay: subjects.AuditEvent("demo", envelope.SubjectSuffix(api.TypeInvoked))},
		{name: "verify relays tool.invoked as a poison event", role: busauth.RoleVerify, typ: api.TypeInvoked,
			source: "urn:toolgate:execute", tenant: "demo", subjectOfRelay: subjects.AuditEvent("demo", envelope.SubjectSuffix(api.TypePoison))},
	}
	for i, tc := range relays {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("relayed-%d-%d", i, time.Now().UnixNano())
			data := fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":%q,"type":%q,"tenantid":%q,"subject":%q,"datacontenttype":"application/json","data":{"invocation_id":%q}}`,
				id, tc.source, tc.typ, tc.tenant, id, id)
			m := &nats.Msg{Subject: tc.subjectOfRelay, Header: nats.Header{"Content-Type": {"application/cloudevents+json"}}, Data: data}
			if _, err := signed(tc.role).PublishMsg(ctx, m); err != nil {
				t.Fatalf("%s relaying on %s: %v", tc.role, tc.subjectOfRelay, err)
			}
			refused := func() bool {
				return poisoned("demo", id, api.ERelayRefused, subjects.Audit+"-relay")
			}
			eventually(t, 30*time.Second, "audit to relay or refuse the event", func() bool {
				return refused() || onTrail(t, ctx, ojs, tc.subjectOfRelay, id) > 0
			})
			if n := onTrail(t, ctx, ojs, tc.subjectOfRelay, id); n > 0 {
				t.Fatalf("audit published the %s event %s on %s", tc.typ, id, tc.subjectOfRelay)
			}
			if !refused() {
				t.Errorf("no poison event of the relay with %s for %s", api.ERelayRefused, id)
			}
		})
	}

	// What each role does emit still goes through: execute's tool.invoked,
	// and a poison event of verify's own.
	t.Run("events of the type and source their subject carries are relayed", func(t *testing.T) {
		for _, c := range []struct {
			role        busauth.Role
			typ, source string
		}{{busauth.RoleExecute, api.TypeInvoked, "urn:toolgate:execute"}, {busauth.RoleVerify, api.TypePoison, "urn:toolgate:verify"}} {
			id := fmt.Sprintf("relayed-ok-%s-%d", c.role, time.Now().UnixNano())
			subject := subjects.AuditEvent("demo", envelope.SubjectSuffix(c.typ))
			data := fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":%q,"type":%q,"tenantid":"demo","datacontenttype":"application/json","data":{}}`,
				id, c.source, c.typ)
			m := &nats.Msg{Subject: subject, Header: nats.Header{"Content-Type": {"application/cloudevents+json"}}, Data: data}
			if _, err := signed(c.role).PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
			eventually(t, 30*time.Second, c.typ+" of "+string(c.role)+" on AUDIT", func() bool { return onTrail(t, ctx, ojs, subject, id) == 1 })
		}
	})
}

// onTrail counts the events on subject in AUDIT whose own id is id.
func onTrail(t *testing.T, ctx context.Context, js jetstream.JetStream, subject, id string) int {
	t.Helper()
	c, err := js.OrderedConsumer(ctx, subjects.StreamAudit, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		b, err := c.FetchNoWait(100)
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range b.Messages() {
			got++
			if strings.Contains(string(m.Data()), `"id":"`+id+`"`) {
				n++
			}
		}
		if got == 0 {
			return n
		}
	}
}
