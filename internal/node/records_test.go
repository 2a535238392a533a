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
	"github.com/toolgate/toolgate/internal/ratelimit"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// The records stages share at run time (a call's cancel flag, its
// checkpoints, the rate-limit counters) are honoured only as their owner
// wrote them, whatever else holds a credential that may write the bucket.
func TestRunTimeRecords(t *testing.T) {
	s := serveEmbedded(t)
	t.Run("a cancel flag another role writes cancels nothing", func(t *testing.T) { forgedCancelFlag(t, s) })
	t.Run("a checkpoint another role writes is not resumed", func(t *testing.T) { forgedCheckpoint(t, s) })
	t.Run("erasing a rate-limit counter does not refill it", func(t *testing.T) { erasedCounter(t, s) })
}

// roleStore is the store a role's credentials open, bound to its buckets.
func roleStore(t *testing.T, s *served, role busauth.Role) (*kvstore.Store, jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js, err := jetstream.New(s.connect(t, 0, s.creds(role)))
	if err != nil {
		t.Fatal(err)
	}
	st, err := kvstore.Open(ctx, js, kvstore.Options{Bind: true, Buckets: busauth.Rights[role].Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	return st, js
}

// invokeAndWait has an agent of demo call tool with params under id and
// returns the call's final record.
func invokeAndWait(t *testing.T, s *served, id, tool, params string, cc *api.CheckpointConfig) api.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, raw := s.agent(t, 0, "demo")
	ac, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	req := api.Request{ToolID: tool, Parameters: json.RawMessage(params), CheckpointConfig: cc, CapabilityToken: raw,
		AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}}
	if _, err := ac.Invoke(ctx, req, client.InvokeOptions{ID: id}); err != nil {
		t.Fatal(err)
	}
	var rec api.Record
	eventually(t, 25*time.Second, "call "+id+" to end", func() bool {
		rec, err = ac.Status(ctx, "demo", id)
		return err == nil && rec.Status.Terminal()
	})
	return rec
}

// refusalAudited waits for the audit event of a record a stage ignored,
// naming what and ecode.
func refusalAudited(t *testing.T, s *served, what, ecode string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	as, err := ojs.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	subject := subjects.AuditEvent(subjects.SystemTenant, envelope.SubjectSuffix(api.TypeStateRefused))
	eventually(t, 15*time.Second, "a state.refused event for "+what+" with "+ecode, func() bool {
		m, err := as.GetLastMsgForSubject(ctx, subject)
		return err == nil && strings.Contains(string(m.Data), what) && strings.Contains(string(m.Data), ecode)
	})
}

// forgedCancelFlag: execute (the host running third-party code) and
// control's credentials may both write the status bucket; a cancel flag
// either writes into another tenant's call, without control's signature,
// does not cancel it.
func forgedCancelFlag(t *testing.T, s *served) {
	for _, role := range []busauth.Role{busauth.RoleExecute, busauth.RoleControl} {
		t.Run(string(role), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			st, _ := roleStore(t, s, role)
			id := fmt.Sprintf("cancel-forged-%s-%d", role, time.Now().UnixNano())
			// Written before the call is published: validate adopts the
			// record, flag and all, as it does a cancel that came first.
			if _, err := st.UpdateRecord(ctx, "demo", id, func(r *api.Record) { r.CancelRequested = true }); err != nil {
				t.Fatalf("%s writing a cancel flag: %v", role, err)
			}
			rec := invokeAndWait(t, s, id, "echo", `{"message":"not cancelled"}`, nil)
			if rec.Status != api.StatusSuccess {
				t.Fatalf("a call under a cancel flag %s wrote ended %s %+v, want success", role, rec.Status, rec.Error)
			}
			refusalAudited(t, s, id, api.ECancelUnsigned)
		})
	}
	// The control service's own cancel still stops a call.
	t.Run("control service", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		nc, raw := s.agent(t, 0, "demo")
		ac, _ := client.New(nc)
		id := fmt.Sprintf("cancel-real-%d", time.Now().UnixNano())
		req := api.Request{ToolID: "sleep", Parameters: json.RawMessage(`{"ms":8000}`), CapabilityToken: raw,
			AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}}
		if _, err := ac.Invoke(ctx, req, client.InvokeOptions{ID: id}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 15*time.Second, "the call to run", func() bool {
			rec, err := ac.Status(ctx, "demo", id)
			return err == nil && rec.Status == api.StatusRunning
		})
		if _, err := ac.Cancel(ctx, "demo", id, "test"); err != nil {
			t.Fatal(err)
		}
		var rec api.Record
		eventually(t, 15*time.Second, "the call to end", func() bool {
			var err error
			rec, err = ac.Status(ctx, "demo", id)
			return err == nil && rec.Status.Terminal()
		})
		if rec.Status != api.StatusCancelled || rec.CancelSig == "" {
			t.Fatalf("a call control cancelled ended %s (cancel signed: %v)", rec.Status, rec.CancelSig != "")
		}
	})
}

// forgedCheckpoint: a named checkpoint that another role wrote or
// rewrote (control may write the bucket to delete checkpoints; execute's
// credentials may write it), or that was moved under another call's name,
// is refused on resume (E3236) and audited; execute's own resumes.
func forgedCheckpoint(t *testing.T, s *served) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	owner := executeCheckpoints(t, s)
	save := func(st *kvstore.Store, inv string, seq int, state string) api.Checkpoint {
		t.Helper()
		cp, err := st.SaveCheckpoint(ctx, api.Checkpoint{Kind: api.CheckpointNamed, Name: "before-upload", Tenant: "demo",
			InvocationID: inv, ToolID: "echo", ToolVersion: "2.0.0", Seq: seq}, json.RawMessage(state), nil)
		if err != nil {
			t.Fatal(err)
		}
		return cp
	}
	resume := func(cpID string) api.Record {
		t.Helper()
		return invokeAndWait(t, s, fmt.Sprintf("resume-%d", time.Now().UnixNano()), "echo", `{"message":"resumed"}`,
			&api.CheckpointConfig{ResumeFromCheckpointID: cpID})
	}
	refused := func(t *testing.T, rec api.Record, cpID string) {
		t.Helper()
		if rec.Status == api.StatusSuccess || rec.Error == nil || rec.Error.ECode != api.ECheckpointUnsigned {
			t.Fatalf("a call resumed from %s ended %s %+v, want E3236", cpID, rec.Status, rec.Error)
		}
		refusalAudited(t, s, cpID, api.ECheckpointUnsigned)
	}

	genuine := save(owner, fmt.Sprintf("cp-owner-%d", time.Now().UnixNano()), 1, `{"step":1}`)
	t.Run("execute's own", func(t *testing.T) {
		if rec := resume(genuine.ID); rec.Status != api.StatusSuccess {
			t.Fatalf("a call resumed from execute's checkpoint ended %s %+v", rec.Status, rec.Error)
		}
	})
	for _, role := range []busauth.Role{busauth.RoleControl, busauth.RoleExecute} {
		t.Run("written by "+string(role)+"'s credentials", func(t *testing.T) {
			st, _ := roleStore(t, s, role)
			cp := save(st, fmt.Sprintf("cp-%s-%d", role, time.Now().UnixNano()), 1, `{"step":9}`)
			refused(t, resume(cp.ID), cp.ID)
		})
		t.Run("rewritten by "+string(role)+"'s credentials", func(t *testing.T) {
			victim := save(owner, fmt.Sprintf("cp-victim-%s-%d", role, time.Now().UnixNano()), 1, `{"step":1}`)
			_, js := roleStore(t, s, role)
			kv, err := js.KeyValue(ctx, kvstore.BucketCheckpoints)
			if err != nil {
				t.Fatal(err)
			}
			// The state skips ahead; its description is execute's, its
			// size and digest made to match.
			state := []byte(`{"step":9}`)
			desc := victim
			desc.StateBytes, desc.StoredBytes = len(state), len(state)
			desc.StoredDigest = sha256Hex(state)
			b, _ := json.Marshal(desc)
			for key, val := range map[string][]byte{
				"s.demo." + victim.InvocationID + ".1.0": state,
				"m.demo." + victim.InvocationID + ".1":   b,
			} {
				if _, err := kv.Put(ctx, key, val); err != nil {
					t.Fatalf("%s rewriting %s: %v", role, key, err)
				}
			}
			refused(t, resume(victim.ID), victim.ID)
		})
	}
	t.Run("moved under another call's name", func(t *testing.T) {
		_, js := roleStore(t, s, busauth.RoleExecute)
		kv, err := js.KeyValue(ctx, kvstore.BucketCheckpoints)
		if err != nil {
			t.Fatal(err)
		}
		other := fmt.Sprintf("cp-other-%d", time.Now().UnixNano())
		moved := genuine
		moved.ID, moved.InvocationID = kvstore.CheckpointID(other, 1), other
		b, _ := json.Marshal(moved)
		e, err := kv.Get(ctx, "s.demo."+genuine.InvocationID+".1.0")
		if err != nil {
			t.Fatal(err)
		}
		for key, val := range map[string][]byte{"s.demo." + other + ".1.0": e.Value(), "m.demo." + other + ".1": b} {
			if _, err := kv.Put(ctx, key, val); err != nil {
				t.Fatal(err)
			}
		}
		refused(t, resume(moved.ID), moved.ID)
	})
}

// erasedCounter: route's credentials may write the rate-limit bucket;
// purging a spent counter is refused by the bucket, and deleting it
// leaves it spent, for the limiter route runs and in a real call.
func erasedCounter(t *testing.T, s *served) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, js := roleStore(t, s, busauth.RoleRoute)
	kv, err := js.KeyValue(ctx, kvstore.BucketRateLimits)
	if err != nil {
		t.Fatal(err)
	}
	m := &tools.Manifest{ID: fmt.Sprintf("rl-%d", time.Now().UnixNano()), RateLimit: &tools.RateLimit{Requests: 1, PerSeconds: 3600}}
	allow := func() bool {
		t.Helper()
		ok, _, err := ratelimit.New(st, 1).Allow(ctx, "demo", "", m) // a fresh limiter: no lease held
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !allow() || allow() {
		t.Fatal("a limit of one call an hour did not allow exactly one")
	}
	key := subjects.Token("demo") + "." + subjects.Token(m.ID)
	if err := kv.Purge(ctx, key); err == nil && allow() {
		t.Fatal("route purged its spent counter and the limit allowed a call again")
	}
	if err := kv.Delete(ctx, key); err != nil {
		t.Fatalf("route deleting its counter: %v", err)
	}
	if allow() {
		t.Fatal("route deleted its spent counter and the limit allowed a call again")
	}

	// Through the pipeline: a tool limited to one call an hour, its
	// counter deleted by route's credentials after the first call.
	manifest := fmt.Sprintf(`{"id":"rl.echo.%d","name":"Limited echo","version":"1.0.0","description":"Echo, once an hour.",
		"category":"utility","kind":"builtin","builtin":{"function":"echo"},
		"input_schema":{"type":"object","properties":{"message":{"type":"string"}},"required":["message"]},
		"output_schema":{"type":"object"},"safety":{"risk_level":"low","idempotent":true},
		"rate_limit":{"requests":1,"per_seconds":3600}}`, time.Now().UnixNano())
	var id struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal([]byte(manifest), &id)
	if _, err := s.operator(t).RegisterTool(ctx, []byte(manifest), false); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the limited tool to be known", func() bool {
		_, err := s.node.Registry.Resolve(id.ID, "")
		return err == nil
	})
	call := func() api.Record {
		return invokeAndWait(t, s, fmt.Sprintf("rl-call-%d", time.Now().UnixNano()), id.ID, `{"message":"hi"}`, nil)
	}
	if rec := call(); rec.Status != api.StatusSuccess {
		t.Fatalf("the first call ended %s %+v", rec.Status, rec.Error)
	}
	if err := kv.Delete(ctx, subjects.Token("demo")+"."+subjects.Token(id.ID)); err != nil {
		t.Fatal(err)
	}
	if rec := call(); rec.Error == nil || rec.Error.ECode != api.ERateLimited {
		t.Fatalf("a call after route deleted the spent counter ended %s %+v, want E3303", rec.Status, rec.Error)
	}
	refusalAudited(t, s, id.ID, api.ECounterErased)
}
