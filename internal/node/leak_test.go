package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// leakedRoles runs, against the real server, what a thief holding one
// role's credentials would try first: the JetStream calls that write
// anywhere (a stream whose republish lands on the policy bucket, a push
// consumer delivering onto the control service's register endpoint),
// deleting the stages' consumers, and writing every bucket. Each must be
// refused but the bucket writes the role's work needs; afterwards the
// topology is as it was.
func leakedRoles(t *testing.T, s *served) {
	// The buckets each role writes, by hand: a right added to a role fails
	// here until it is added on purpose.
	writes := map[busauth.Role][]string{
		busauth.RoleValidate:  {subjects.BucketInvocations},
		busauth.RoleAuthorize: {subjects.BucketInvocations, subjects.BucketApprovals, subjects.BucketBudgets, subjects.BucketSettings},
		busauth.RoleRoute:     {subjects.BucketRateLimits},
		busauth.RoleExecute: {subjects.BucketInvocations, subjects.BucketIdempotency, subjects.BucketCheckpoints,
			subjects.BucketBreakers, subjects.BucketModelStats, subjects.BucketSettings, subjects.BucketDocCache,
			subjects.BucketAgentRuns},
		busauth.RoleVerify: nil,
		busauth.RoleAudit:  {subjects.BucketInvocations, subjects.BucketBudgets, subjects.BucketToolStats},
		busauth.RoleControl: {subjects.BucketTools, subjects.BucketApprovals, subjects.BucketInvocations, subjects.BucketCapabilities,
			subjects.BucketPolicies, subjects.BucketHooks, subjects.BucketRevocations, subjects.BucketBreakers, subjects.BucketModels,
			subjects.BucketDocSources, subjects.BucketCheckpoints},
	}
	// jsRefused sends a JetStream API request and reports whether the
	// server refused it for permissions (a refused request gets no reply).
	jsRefused := func(t *testing.T, nc *nats.Conn, subject string, body any) bool {
		b, _ := json.Marshal(body)
		_, err := nc.Request(subject, b, 500*time.Millisecond)
		if err == nil {
			return false
		}
		if ferr := nc.Flush(); ferr != nil {
			t.Error(ferr)
			return false
		}
		return errors.Is(nc.LastError(), nats.ErrPermissionViolation) && strings.Contains(nc.LastError().Error(), subject)
	}
	attacks := []struct {
		name    string
		subject string
		body    any
	}{
		{"a stream republishing onto the policy bucket", "$JS.API.STREAM.CREATE.EVIL", jetstream.StreamConfig{
			Name: "EVIL", Subjects: []string{"evil.>"},
			RePublish: &jetstream.RePublish{Source: "evil.>", Destination: "$KV.toolgate_policies.>"}}},
		{"a push consumer delivering onto tools.register", "$JS.API.CONSUMER.CREATE." + subjects.BucketStream(subjects.BucketTools),
			map[string]any{"stream_name": subjects.BucketStream(subjects.BucketTools),
				"config": map[string]any{"deliver_subject": subjects.SvcToolsRegister, "deliver_group": "q", "ack_policy": "none"}}},
		{"a durable on the pipeline", "$JS.API.CONSUMER.DURABLE.CREATE." + subjects.StreamPipeline + ".evil",
			map[string]any{"stream_name": subjects.StreamPipeline, "config": map[string]any{"durable_name": "evil"}}},
		{"deleting execute's consumer", "$JS.API.CONSUMER.DELETE." + subjects.StreamPipeline + ".execute-normal", nil},
		{"deleting validate's consumer", "$JS.API.CONSUMER.DELETE." + subjects.StreamInvoke + ".validate", nil},
		{"updating the audit stream", "$JS.API.STREAM.UPDATE." + subjects.StreamAudit, nil},
		{"purging the revocations", "$JS.API.STREAM.PURGE." + subjects.BucketStream(subjects.BucketRevocations), nil},
		{"deleting an audit event", "$JS.API.STREAM.MSG.DELETE." + subjects.StreamAudit, map[string]any{"seq": 1}},
	}
	roles := append(slices.Clone(busauth.StageRoles), busauth.RoleControl)
	// Refused requests wait out their timeout: every role's attacks run
	// side by side.
	t.Run("roles", func(t *testing.T) {
		var wg sync.WaitGroup
		for _, role := range roles {
			for i, a := range attacks {
				nc := s.connect(t, i, s.creds(role))
				wg.Go(func() {
					if !jsRefused(t, nc, a.subject, a.body) {
						t.Errorf("%s: %s (%s) was not refused (last error %v)", role, a.name, a.subject, nc.LastError())
					}
				})
			}
		}
		wg.Wait()
		for _, role := range roles {
			t.Run(string(role), func(t *testing.T) {
				for i, b := range subjects.Buckets {
					want := slices.Contains(writes[role], b)
					nc := s.connect(t, i, s.creds(role))
					got, err := refused(t, nc, false, "$KV."+b+".probe")
					if err != nil {
						t.Fatal(err)
					}
					if got == want {
						t.Errorf("%s writing %s: refused=%v, want allowed=%v", role, b, got, want)
					}
				}
				nc := s.connect(t, 0, s.creds(role))
				if got, _ := refused(t, nc, false, subjects.KVFeed(subjects.BucketPolicies)+"bundle"); !got {
					t.Errorf("%s may publish on the policy bucket's watch feed", role)
				}
			})
		}
	})
	t.Run("a stage given another role's credentials says so at once", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		n, err := node.OpenRole(ctx, s.urls[0], "wrong-role", busauth.RoleExecute, topology.TopologyOptions{}, quietLog(),
			s.creds(busauth.RoleVerify), nats.NoReconnect())
		if err == nil {
			n.Close()
			t.Fatal("execute bound with verify's credentials")
		}
		if !strings.Contains(err.Error(), "another role") || time.Since(start) > 5*time.Second {
			t.Fatalf("after %v: %v, want a refusal naming the wrong role at once", time.Since(start), err)
		}
	})
	t.Run("the topology is intact", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		js, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
		if _, err := js.Stream(ctx, "EVIL"); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("stream EVIL: %v, want not found", err)
		}
		for _, stage := range subjects.Stages {
			for _, in := range subjects.Inputs(stage) {
				if _, err := js.Consumer(ctx, in.Stream, in.Consumer); err != nil {
					t.Errorf("consumer %s: %v", in.Consumer, err)
				}
			}
		}
		if _, err := js.Consumer(ctx, subjects.StreamPipeline, "evil"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Errorf("consumer evil: %v, want not found", err)
		}
	})
}

// crossTenant runs what an agent of one tenant would try against another:
// naming the other's inbox as the reply subject of its invocation and of a
// control request (the JetStream ack and the answer must not land there),
// and sending the same raw Nats-Msg-Id at the same moment (both calls must
// run). An agent of a tenant the servers have no account for is refused,
// with the reason audited; the embedded server makes the account.
func crossTenant(t *testing.T, s *served) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t.Run("replies into another tenant's inbox", func(t *testing.T) {
		attacker, _ := s.agent(t, 0, "demo")
		victimRaw, vc := agentToken(t, "other", nil)
		victim := s.connect(t, 1, nats.Token(victimRaw), nats.CustomInboxPrefix(busauth.InboxPrefix("other", vc.ID)))
		stolen, err := victim.SubscribeSync(busauth.InboxPrefix("other", vc.ID) + ".>")
		if err != nil {
			t.Fatal(err)
		}
		if err := victim.Flush(); err != nil {
			t.Fatal(err)
		}
		target := busauth.InboxPrefix("other", vc.ID) + ".stolen"
		status := subjects.TenantSvc("demo", subjects.SvcStatus)
		for _, subj := range []string{subjects.Invoke("demo"), status} {
			if err := attacker.PublishMsg(&nats.Msg{Subject: subj, Reply: target, Header: ceHeader("cross-reply"),
				Data: []byte(`{"invocation_id":"cross-reply"}`)}); err != nil {
				t.Fatal(err)
			}
		}
		// The same paths answer the attacker's own requests.
		js, _ := jetstream.New(attacker)
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subjects.Invoke("demo"), Header: ceHeader("cross-own"), Data: []byte(`{}`)}); err != nil {
			t.Fatalf("own invoke: %v", err)
		}
		if _, err := attacker.RequestWithContext(ctx, status, []byte(`{"invocation_id":"cross-own"}`)); err != nil {
			t.Fatalf("own status request: %v", err)
		}
		if m, err := stolen.NextMsg(500 * time.Millisecond); err == nil {
			t.Fatalf("tenant other's inbox received a reply to tenant demo's request: %q", m.Data)
		}
	})
	t.Run("the same raw Nats-Msg-Id from two tenants", func(t *testing.T) {
		type call struct {
			nc     *nats.Conn
			tenant string
			id     string
		}
		var calls []call
		for i, tenant := range []string{"demo", "other"} {
			raw, c := agentToken(t, tenant, nil)
			nc := s.connect(t, i, nats.Token(raw), nats.CustomInboxPrefix(busauth.InboxPrefix(tenant, c.ID)))
			body, _ := json.Marshal(map[string]any{"tool_id": "echo", "parameters": map[string]string{"message": tenant},
				"agent_context": map[string]string{"agent_did": c.AgentDID, "tenant_id": tenant}, "capability_token": raw})
			h := ceHeader("msgid-" + tenant + "-" + c.ID)
			h.Set(nats.MsgIdHdr, "same-raw-msg-id")
			calls = append(calls, call{nc, tenant, h.Get("ce-id")})
			js, _ := jetstream.New(nc)
			ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: subjects.Invoke(tenant), Header: h, Data: body})
			if err != nil || ack.Duplicate {
				t.Fatalf("tenant %s: ack %+v, %v: its call was dropped as the other tenant's duplicate", tenant, ack, err)
			}
		}
		for _, c := range calls {
			ac, _ := client.New(c.nc)
			resp, err := ac.Wait(ctx, c.tenant, c.id)
			if err != nil || resp.Status != api.StatusSuccess {
				t.Fatalf("tenant %s: %+v %v", c.tenant, resp, err)
			}
		}
	})
	t.Run("a tenant without an account", func(t *testing.T) {
		raw, c := agentToken(t, "newcomer", nil)
		nc, err := s.dial(0, nats.Token(raw), nats.CustomInboxPrefix(busauth.InboxPrefix("newcomer", c.ID)))
		if s.declared == nil {
			// The embedded server makes the tenant's account on its first
			// connection, and the agent can work.
			if err != nil {
				t.Fatalf("a new tenant's agent on the embedded server: %v", err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			if _, err := js.Publish(ctx, subjects.Invoke("newcomer"), []byte(`{}`)); err != nil {
				t.Fatalf("a new tenant's invoke: %v", err)
			}
			return
		}
		if err == nil {
			nc.Close()
			t.Fatal("an agent of an undeclared tenant was admitted")
		}
		ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
		eventually(t, 10*time.Second, "a bus.refused audit event naming the undeclared tenant", func() bool {
			st, err := ojs.Stream(ctx, subjects.StreamAudit)
			if err != nil {
				return false
			}
			m, err := st.GetLastMsgForSubject(ctx, subjects.AuditEvent(subjects.SystemTenant, "bus.refused"))
			return err == nil && strings.Contains(string(m.Data), busauth.ErrWrongTenant.Error()) && strings.Contains(string(m.Data), "newcomer")
		})
	})
}
