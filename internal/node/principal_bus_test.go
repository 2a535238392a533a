package node_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/token"
)

// TestHookChildAsVerifiedPrincipal: on an authenticated bus audit starts a
// hook's child as the principal authorize verified, whether the call was
// admitted (its seal covers the principal, which is signed no more) or
// refused (its principal signed apart).
func TestHookChildAsVerifiedPrincipal(t *testing.T) {
	s := serveEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	op := s.operator(t)
	for _, doc := range []string{hookTools[0], hookTools[5]} { // hk.fallback, hk.secret
		if _, err := op.RegisterTool(ctx, []byte(doc), false); err != nil {
			t.Fatal(err)
		}
	}
	const tenant = "hkbus"
	call := func(tool, params string, grants ...string) (api.Response, *client.Client) {
		t.Helper()
		raw, c := agentToken(t, tenant, func(c *token.Claims) {
			if len(grants) > 0 {
				c.ToolID = grants
			}
		})
		ac, err := client.New(s.connect(t, 0, nats.Token(raw), nats.CustomInboxPrefix(busauth.InboxPrefix(tenant, c.ID))))
		if err != nil {
			t.Fatal(err)
		}
		id, err := ac.Invoke(ctx, api.Request{ToolID: tool, Parameters: json.RawMessage(params),
			AgentContext: api.AgentContext{AgentDID: "did:agent:" + tenant, TenantID: tenant}, CapabilityToken: raw}, client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := ac.Wait(ctx, tenant, id)
		if err != nil {
			t.Fatal(err)
		}
		return r, ac
	}
	first, ac := call("hk.fallback", `{"fail":true}`)
	// Its builtin is not in serve's binary: the call fails after execute
	// admitted it.
	if first.Status != api.StatusError || first.Error == nil {
		t.Fatalf("the sealed original: %+v", first)
	}
	child, err := ac.Wait(ctx, tenant, first.InvocationID+".hook1")
	if err != nil || child.Status != api.StatusSuccess || !strings.Contains(string(child.Result), "fallback for hk.fallback") {
		t.Fatalf("the fallback of a sealed call: %+v %v", child, err)
	}
	denied, ac := call("hk.secret", `{"message":"x"}`, "echo")
	if denied.Status != api.StatusPermissionDenied || denied.Error == nil || denied.Error.ECode != api.ENotGranted {
		t.Fatalf("the refused original: %+v", denied)
	}
	child, err = ac.Wait(ctx, tenant, denied.InvocationID+".hook1")
	if err != nil || child.Status != api.StatusSuccess || !strings.Contains(string(child.Result), "denied: E3210") {
		t.Fatalf("the fallback of a refused call: %+v %v", child, err)
	}
}
