package node_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	cenats "github.com/cloudevents/sdk-go/protocol/nats/v2"
	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/subjects"
)

// agentCloudEventsSDK: an agent holding only its token sends its calls
// with the CloudEvents Go SDK's NATS binding, in binary and in structured
// mode, and reads their results. The SDK's JetStream binding is not open
// to it: it reads the invoke stream's information, which spans every
// tenant, before its first send (docs/contract.md says which to use).
func agentCloudEventsSDK(t *testing.T, s *served) {
	const tenant = "demo"
	nc, raw := s.agent(t, 1, tenant)
	sub, err := nc.SubscribeSync(subjects.ResultAgent(tenant, "did:agent:"+tenant))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	sender, err := cenats.NewSenderFromConn(nc, subjects.Invoke(tenant))
	if err != nil {
		t.Fatal(err)
	}
	c, err := cloudevents.NewClient(sender)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, mode := range []string{"binary", "structured"} {
		ev := cloudevents.NewEvent()
		id := "sdk-" + mode + "-" + time.Now().Format("150405.000000000")
		ev.SetID(id)
		ev.SetSource("urn:agent:sdk")
		ev.SetType(envelope.EventType)
		req := api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"` + mode + `"}`),
			AgentContext: api.AgentContext{AgentDID: "did:agent:" + tenant, TenantID: tenant}, CapabilityToken: raw}
		if err := ev.SetData(cloudevents.ApplicationJSON, req); err != nil {
			t.Fatal(err)
		}
		sctx := ctx
		if mode == "structured" {
			sctx = binding.WithForceStructured(ctx)
		}
		if res := c.Send(sctx, ev); cloudevents.IsUndelivered(res) {
			t.Fatalf("%s: %v", mode, res)
		}
		for {
			m, err := sub.NextMsg(30 * time.Second)
			if err != nil {
				t.Fatalf("%s: no result for %s: %v", mode, id, err)
			}
			if m.Subject != subjects.Result(tenant, "did:agent:"+tenant, id) {
				continue
			}
			resp, err := client.DecodeResult(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Status != api.StatusSuccess || !strings.Contains(string(resp.Result), mode) {
				t.Fatalf("%s: result %+v, want success echoing the mode", mode, resp)
			}
			break
		}
	}
	if _, err := cejs.NewSenderFromConn(nc, subjects.StreamInvoke, subjects.Invoke(tenant), []nats.JSOpt{nats.MaxWait(time.Second)}); err == nil {
		t.Fatal("the SDK's JetStream sender was set up for an agent: it read or made a stream")
	}
}
