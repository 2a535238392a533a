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
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/subjects"
)

// onlyAuditPublishes: audit events and results reach their streams from
// audit alone. Another role's credentials cannot publish them; what a role
// emits on the relay is published by audit only if that role's key signed
// it and the role emits that subject; a pending answer relayed after the
// call's terminal result is dropped.
func onlyAuditPublishes(t *testing.T, s *served) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	audit, err := ojs.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	results, err := ojs.Stream(ctx, subjects.StreamResults)
	if err != nil {
		t.Fatal(err)
	}
	key := func(r busauth.Role) *seal.Signer { return s.hopSigner(t, r) }
	roleJS := func(r busauth.Role) jetstream.JetStream {
		js, _ := jetstream.New(s.connect(t, 0, s.creds(r)))
		return js
	}
	event := func(typ, id string) (subject string, data []byte) {
		return subjects.AuditEvent("demo", envelope.SubjectSuffix(typ)),
			fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"urn:toolgate:execute","type":%q,"tenantid":"demo"}`, id, typ)
	}

	t.Run("stage credentials cannot publish audit events or results", func(t *testing.T) {
		for _, r := range []busauth.Role{busauth.RoleValidate, busauth.RoleExecute, busauth.RoleVerify, busauth.RoleControl} {
			js := roleJS(r)
			pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
			for _, subject := range []string{subjects.AuditEvent("demo", "tool.succeeded"), subjects.Result("demo", "did:agent:demo", "forged")} {
				if _, err := js.Publish(pctx, subject, []byte(`{}`)); err == nil {
					t.Errorf("%s published %s", r, subject)
				}
			}
			pcancel()
		}
	})

	// refused is a relayed message audit must not publish: it is recorded
	// as poison with E3224 by the relay, and nothing of it reaches AUDIT.
	refused := []struct {
		name   string
		creds  busauth.Role
		signer *seal.Signer
		typ    string
	}{
		{"unsigned, with execute's credentials", busauth.RoleExecute, nil, api.TypeInvoked},
		{"signed with verify's key, which emits no tool.invoked", busauth.RoleExecute, key(busauth.RoleVerify), api.TypeInvoked},
	}
	for i, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("relayed-%d-%d", i, time.Now().UnixNano())
			subject, data := event(tc.typ, id)
			relay := subjects.Relay(subject)
			h := nats.Header{}
			if tc.signer != nil {
				h = tc.signer.Sign(relay, h, data)
			}
			if _, err := roleJS(tc.creds).PublishMsg(ctx, &nats.Msg{Subject: relay, Header: h, Data: data}); err != nil {
				t.Fatalf("%s emitting on %s: %v", tc.creds, relay, err)
			}
			eventually(t, 20*time.Second, "a poison event with E3224 for the relayed event", func() bool {
				m, err := audit.GetLastMsgForSubject(ctx, subjects.AuditEvent("demo", envelope.SubjectSuffix(api.TypePoison)))
				return err == nil && strings.Contains(string(m.Data), relay) && strings.Contains(string(m.Data), api.EMessageUnsigned)
			})
			if m, err := audit.GetLastMsgForSubject(ctx, subject); err == nil && strings.Contains(string(m.Data), id) {
				t.Fatalf("audit published the refused event: %s", m.Data)
			}
		})
	}

	t.Run("an event execute signed is published by audit", func(t *testing.T) {
		id := fmt.Sprintf("relayed-ok-%d", time.Now().UnixNano())
		subject, data := event(api.TypeInvoked, id)
		js := runner.Relaying(seal.SigningJetStream(roleJS(busauth.RoleExecute), key(busauth.RoleExecute)))
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data}, jetstream.WithMsgID("relay-test-"+id)); err != nil {
			t.Fatal(err)
		}
		var m *jetstream.RawStreamMsg
		eventually(t, 20*time.Second, "the relayed event on AUDIT", func() bool {
			m, err = audit.GetLastMsgForSubject(ctx, subject)
			return err == nil && strings.Contains(string(m.Data), id)
		})
		if m.Header.Get(seal.HeaderSigner) == string(busauth.RoleExecute) {
			t.Error("the published event still carries execute's signature: audit published it as execute's")
		}
		if got := m.Header.Get(jetstream.MsgIDHeader); got != "relay-test-"+id {
			t.Errorf("message id %q, want the emitter's", got)
		}
	})

	t.Run("a pending answer relayed after the result is dropped", func(t *testing.T) {
		id := fmt.Sprintf("late-pending-%d", time.Now().UnixNano())
		subject := subjects.Result("demo", "did:agent:demo", id)
		// The terminal result first, as audit publishes it.
		ajs := seal.SigningJetStream(roleJS(busauth.RoleAudit), key(busauth.RoleAudit))
		if _, err := ajs.Publish(ctx, subject, []byte(`{"invocation_id":"`+id+`","status":"success"}`)); err != nil {
			t.Fatal(err)
		}
		vjs := runner.Relaying(seal.SigningJetStream(roleJS(busauth.RoleValidate), key(busauth.RoleValidate)))
		pending := fmt.Sprintf(`{"specversion":"1.0","id":"%s:accepted","source":"urn:toolgate:validate","type":%q,"data":{"invocation_id":%q,"status":"pending"}}`,
			id, api.TypeAccepted, id)
		if _, err := vjs.Publish(ctx, subject, []byte(pending)); err != nil {
			t.Fatal(err)
		}
		// A marker relayed after it shows the relay got past the pending.
		marker := fmt.Sprintf("marker-%d", time.Now().UnixNano())
		msubject, mdata := event(api.TypeInvoked, marker)
		ejs := runner.Relaying(seal.SigningJetStream(roleJS(busauth.RoleExecute), key(busauth.RoleExecute)))
		if _, err := ejs.Publish(ctx, msubject, mdata); err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "the marker relayed", func() bool {
			m, err := audit.GetLastMsgForSubject(ctx, msubject)
			return err == nil && strings.Contains(string(m.Data), marker)
		})
		eventually(t, 10*time.Second, "the relay to be drained", func() bool {
			info, err := ojs.Stream(ctx, subjects.StreamRelay)
			return err == nil && info.CachedInfo().State.Msgs == 0
		})
		m, err := results.GetLastMsgForSubject(ctx, subject)
		if err != nil || !strings.Contains(string(m.Data), `"success"`) {
			t.Fatalf("the result subject holds %s (%v), want the terminal result", m.Data, err)
		}
	})

	// A real async call: validate's own pending answer passes audit's
	// check (published, or dropped only because the result came first),
	// never refused as poison.
	t.Run("an async call's pending answer is not refused", func(t *testing.T) {
		nc, raw := s.agent(t, 1, "demo")
		ac, err := client.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		id, err := ac.Invoke(ctx, api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"later"}`), ExecutionOptions: &api.ExecutionOptions{AsyncMode: true},
			AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}, CapabilityToken: raw}, client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := ac.Wait(ctx, "demo", id); err != nil || r.Status != api.StatusSuccess {
			t.Fatalf("async call: %+v %v", r, err)
		}
		eventually(t, 10*time.Second, "the relay to be drained", func() bool {
			info, err := ojs.Stream(ctx, subjects.StreamRelay)
			return err == nil && info.CachedInfo().State.Msgs == 0
		})
		if m, err := audit.GetLastMsgForSubject(ctx, subjects.AuditEvent("demo", envelope.SubjectSuffix(api.TypePoison))); err == nil &&
			strings.Contains(string(m.Data), subjects.Relay(subjects.Result("demo", "did:agent:demo", id))) {
			t.Fatalf("audit refused validate's pending answer: %s", m.Data)
		}
	})

	// A tool done within execute's grace has its tool.invoked carried to
	// audit with its ending: no relay write. One still running past it is
	// announced through the relay while it runs. Either way the trail
	// holds one tool.invoked, execute's, before the ending.
	t.Run("tool.invoked is relayed only for a tool still running", func(t *testing.T) {
		nc, raw := s.agent(t, 1, "demo")
		ac, err := client.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		// Its own results only: a subscription to any agent's would be
		// refused, and the refusal audited through the relay.
		ac.AgentDID = "did:agent:demo"
		relayed := func() uint64 {
			eventually(t, 10*time.Second, "the relay to be drained", func() bool {
				info, err := ojs.Stream(ctx, subjects.StreamRelay)
				return err == nil && info.CachedInfo().State.Msgs == 0
			})
			info, err := ojs.Stream(ctx, subjects.StreamRelay)
			if err != nil {
				t.Fatal(err)
			}
			return info.CachedInfo().State.LastSeq
		}
		for _, c := range []struct {
			tool, params string
			relays       uint64
		}{{"echo", `{"message":"quick"}`, 0}, {"sleep", `{"ms":2000}`, 1}} {
			// The sleep outlasts the relay's publish of its tool.invoked
			// even on a machine loaded by a race-detector test run.
			before := relayed()
			id, err := ac.Invoke(ctx, api.Request{ToolID: c.tool, Parameters: json.RawMessage(c.params),
				AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}, CapabilityToken: raw}, client.InvokeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			r, err := ac.Wait(ctx, "demo", id)
			if err != nil || r.Status != api.StatusSuccess {
				t.Fatalf("%s: %+v %v", c.tool, r, err)
			}
			if got := relayed() - before; got != c.relays {
				t.Errorf("%s: %d relay writes, want %d", c.tool, got, c.relays)
			}
			var types []string
			eventually(t, 10*time.Second, "the call's events on AUDIT", func() bool {
				types = nil
				for _, typ := range []string{api.TypeInvoked, api.TypeSucceeded} {
					m, err := audit.GetLastMsgForSubject(ctx, subjects.AuditEvent("demo", envelope.SubjectSuffix(typ)))
					if err == nil && strings.Contains(string(m.Data), r.InvocationID) {
						types = append(types, typ)
					}
				}
				return len(types) == 2
			})
			inv, err := audit.GetLastMsgForSubject(ctx, subjects.AuditEvent("demo", envelope.SubjectSuffix(api.TypeInvoked)))
			if err != nil {
				t.Fatal(err)
			}
			end, err := audit.GetLastMsgForSubject(ctx, subjects.AuditEvent("demo", envelope.SubjectSuffix(api.TypeSucceeded)))
			if err != nil {
				t.Fatal(err)
			}
			if inv.Sequence > end.Sequence || !strings.Contains(string(inv.Data), `"urn:toolgate:execute"`) {
				t.Errorf("%s: tool.invoked at %d from %s, ending at %d", c.tool, inv.Sequence, inv.Data, end.Sequence)
			}
		}
	})

	// Validate's key vouches for the pending answer only: a final result
	// it relays, even for a call with no result yet, is refused.
	t.Run("a final result relayed by validate is refused", func(t *testing.T) {
		id := fmt.Sprintf("forged-result-%d", time.Now().UnixNano())
		subject := subjects.Result("demo", "did:agent:demo", id)
		forged := fmt.Sprintf(`{"specversion":"1.0","id":"%s","source":"urn:toolgate:audit","type":"tool.result","data":{"invocation_id":%q,"status":"success"}}`, id, id)
		vjs := runner.Relaying(seal.SigningJetStream(roleJS(busauth.RoleValidate), key(busauth.RoleValidate)))
		if _, err := vjs.Publish(ctx, subject, []byte(forged)); err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "a poison event for the relayed final result", func() bool {
			m, err := audit.GetLastMsgForSubject(ctx, subjects.AuditEvent("demo", envelope.SubjectSuffix(api.TypePoison)))
			return err == nil && strings.Contains(string(m.Data), subjects.Relay(subject)) && strings.Contains(string(m.Data), api.EMessageUnsigned)
		})
		if m, err := results.GetLastMsgForSubject(ctx, subject); err == nil {
			t.Fatalf("audit published the forged result: %s", m.Data)
		}
	})
}
