package signedstate

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

func TestPolicy(t *testing.T) {
	modules := map[string]string{"authz.rego": "package toolgate.authz\n"}
	body, _ := json.Marshal(api.PolicyPushRequest{Modules: modules})
	signed := &api.DecisionProof{Subject: subjects.SvcPolicyPush, Body: body}
	alice := func(*api.DecisionProof) (string, error) { return "operator:alice", nil }
	forged := func(*api.DecisionProof) (string, error) { return "", errors.New("bad signature") }
	cases := []struct {
		name   string
		b      kvstore.PolicyBundle
		verify Verify
		ok     bool
	}{
		{"signed by the operator it names", kvstore.PolicyBundle{Modules: modules, PushedBy: "operator:alice", Proof: signed}, alice, true},
		{"unsigned", kvstore.PolicyBundle{Modules: modules, PushedBy: "operator:alice"}, alice, false},
		{"a signature that does not verify", kvstore.PolicyBundle{Modules: modules, PushedBy: "operator:alice", Proof: signed}, forged, false},
		{"another operator's push", kvstore.PolicyBundle{Modules: modules, PushedBy: "operator:bob", Proof: signed}, alice, false},
		{"modules other than the pushed ones", kvstore.PolicyBundle{Modules: map[string]string{"authz.rego": "package toolgate.authz\ndecision := {\"allow\": true}\n"},
			PushedBy: "operator:alice", Proof: signed}, alice, false},
		{"data added", kvstore.PolicyBundle{Modules: modules, Data: map[string]any{"allow_all": true}, PushedBy: "operator:alice", Proof: signed}, alice, false},
		{"a signed request to another endpoint", kvstore.PolicyBundle{Modules: modules, PushedBy: "operator:alice",
			Proof: &api.DecisionProof{Subject: subjects.SvcHooksPush, Body: body}}, alice, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Policy(c.b, c.verify)
			if (err == nil) != c.ok {
				t.Fatalf("Policy: %v, want ok=%v", err, c.ok)
			}
		})
	}
}

func TestHooks(t *testing.T) {
	doc := json.RawMessage(`{"hooks":[{"name":"retry","on":"failure","invoke":{"tool_id":"echo"}}]}`)
	body, _ := json.Marshal(api.HooksPushRequest{TenantID: "acme", Doc: doc})
	signed := &api.DecisionProof{Subject: subjects.SvcHooksPush, Body: body}
	alice := func(*api.DecisionProof) (string, error) { return "operator:alice", nil }
	cases := []struct {
		name string
		set  kvstore.HookSet
		ok   bool
	}{
		{"signed, spaced differently", kvstore.HookSet{Tenant: "acme", Doc: json.RawMessage(` { "hooks" : [{"name":"retry","on":"failure","invoke":{"tool_id":"echo"}}] }`),
			PushedBy: "operator:alice", Proof: signed}, true},
		{"unsigned", kvstore.HookSet{Tenant: "acme", Doc: doc, PushedBy: "operator:alice"}, false},
		{"moved to another tenant", kvstore.HookSet{Tenant: "other", Doc: doc, PushedBy: "operator:alice", Proof: signed}, false},
		{"another document", kvstore.HookSet{Tenant: "acme", Doc: json.RawMessage(`{"hooks":[]}`), PushedBy: "operator:alice", Proof: signed}, false},
		{"a policy push's signature", kvstore.HookSet{Tenant: "acme", Doc: doc, PushedBy: "operator:alice",
			Proof: &api.DecisionProof{Subject: subjects.SvcPolicyPush, Body: body}}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := Hooks(c.set, alice); (err == nil) != c.ok {
				t.Fatalf("Hooks: %v, want ok=%v", err, c.ok)
			}
		})
	}
}

func TestRefusedEvent(t *testing.T) {
	a, err := RefusedEvent("urn:toolgate:authorize", "policy", 7, errors.New("unsigned"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := RefusedEvent("urn:toolgate:authorize", "policy", 7, errors.New("unsigned"))
	if a.Subject != "audit._system.state.refused" || a.MsgID != b.MsgID {
		t.Fatalf("subject %s, ids %s %s: want one event per reader and revision", a.Subject, a.MsgID, b.MsgID)
	}
}

func TestTool(t *testing.T) {
	manifest := json.RawMessage(`{"id":"t","version":"1.0.0","kind":"builtin","builtin":{"function":"echo"},"limits":{"timeout_ms":500}}`)
	body, _ := json.Marshal(api.RegisterRequest{Manifest: manifest, Replace: true})
	signed := &api.DecisionProof{Subject: subjects.SvcToolsRegister, Body: body}
	stored, err := kvstore.StampLifecycle(manifest, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), time.Date(2026, 2, 3, 4, 5, 6, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	alice := func(*api.DecisionProof) (string, error) { return "operator:alice", nil }
	cases := []struct {
		name string
		rec  kvstore.ToolRecord
		ok   bool
	}{
		{"signed, stamped by the store", kvstore.ToolRecord{Manifest: stored, RegisteredBy: "operator:alice", Proof: signed}, true},
		{"unsigned", kvstore.ToolRecord{Manifest: stored, RegisteredBy: "operator:alice"}, false},
		{"another function", kvstore.ToolRecord{Manifest: json.RawMessage(strings.Replace(string(stored), "echo", "noop", 1)),
			RegisteredBy: "operator:alice", Proof: signed}, false},
		{"a number rewritten", kvstore.ToolRecord{Manifest: json.RawMessage(strings.Replace(string(stored), "500", "500.0", 1)),
			RegisteredBy: "operator:alice", Proof: signed}, false},
		{"another operator named", kvstore.ToolRecord{Manifest: stored, RegisteredBy: "operator:bob", Proof: signed}, false},
		{"a policy push's signature", kvstore.ToolRecord{Manifest: stored, RegisteredBy: "operator:alice",
			Proof: &api.DecisionProof{Subject: subjects.SvcPolicyPush, Body: body}}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := Tool(c.rec, alice); (err == nil) != c.ok {
				t.Fatalf("Tool: %v, want ok=%v", err, c.ok)
			}
		})
	}
}
