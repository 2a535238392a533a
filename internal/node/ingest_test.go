package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// ceHeader is a binary-mode tool.invoke header with id.
func ceHeader(id string) nats.Header {
	h := nats.Header{}
	h.Set("ce-specversion", "1.0")
	h.Set("ce-id", id)
	h.Set("ce-source", "urn:test")
	h.Set("ce-type", "tool.invoke")
	h.Set("content-type", "application/json")
	return h
}

func echoBody(tenant, msg string) []byte {
	body := `{"tool_id":"echo","agent_context":{"agent_did":"did:agent:test","tenant_id":"` + tenant + `"},"parameters":{"message":"` + msg + `"}}`
	return []byte(withToken(body, tenant, "did:agent:test"))
}

// resultOf waits for the first result on tool.result.<tenant>.<id>.
func (e *env) resultOf(tenant, id string) api.Response {
	e.t.Helper()
	resp, err := client.DecodeResult(e.read(subjects.StreamResults, subjects.ResultAnyAgent(tenant, id), 1, 30*time.Second)[0].Data())
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

func wantCode(t *testing.T, resp api.Response, ecode string) {
	t.Helper()
	if resp.Status != api.StatusError && resp.Status != api.StatusPermissionDenied || resp.Error == nil || resp.Error.ECode != ecode {
		t.Fatalf("response %+v, error %+v: want %s", resp, resp.Error, ecode)
	}
}

// TestOversizedNamesEndCleanly sends an id that escapes to 4,500 bytes and a
// tenant of 3,900 characters: each ends with E3019, and the pipeline's
// connection survives to run the next call.
func TestOversizedNamesEndCleanly(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})

	resp := e.publishRaw("tool.invoke.acme", ceHeader(strings.Repeat(".", 1500)), echoBody("acme", "x"))
	wantCode(t, resp, api.EInvalidName)
	if !strings.HasPrefix(resp.InvocationID, "seq-") {
		t.Fatalf("invocation id %q", resp.InvocationID)
	}

	long := strings.Repeat("t", 3900)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.js.PublishMsg(ctx, &nats.Msg{Subject: "tool.invoke." + long, Header: ceHeader("long-tenant"), Data: echoBody(long, "x")}); err != nil {
		t.Fatal(err)
	}
	ev := e.auditOf(subjects.SystemTenant, 1)[0]
	var rec envelope.AuditRecord
	if err := ev.DataAs(&rec); err != nil || ev.Type() != api.TypeRejected || !strings.Contains(string(ev.Data()), api.EInvalidName) {
		t.Fatalf("audit event %s: %s (%v)", ev.Type(), ev.Data(), err)
	}
	// A reserved tenant is refused the same way.
	if _, err := e.js.PublishMsg(ctx, &nats.Msg{Subject: "tool.invoke._system", Header: ceHeader("reserved"), Data: echoBody("_system", "x")}); err != nil {
		t.Fatal(err)
	}
	if evs := e.auditOf(subjects.SystemTenant, 2); evs[1].Type() != api.TypeRejected {
		t.Fatalf("reserved tenant: audit %s", evs[1].Type())
	}
	if n := e.count(subjects.StreamResults, subjects.ResultTenant(subjects.SystemTenant)); n != 0 {
		t.Fatalf("%d results for refused tenants", n)
	}

	if resp := e.invoke(request("acme", "echo", `{"message":"still here"}`)); resp.Status != api.StatusSuccess {
		t.Fatalf("after the oversized names: %+v", resp)
	}
}

// TestConnectionClosedEndsRun closes the pipeline's NATS connection for good:
// Run must return ErrConnectionClosed instead of idling.
func TestConnectionClosedEndsRun(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	nodes := make(chan *node.Node, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- node.Run(context.Background(), node.Config{NATSURL: e.url, Examples: true, Workers: 1, Log: quietLog(),
			Topology: e.topo, Stage: node.StageConfig{Tokens: testVerifier()},
			Ready: func(_ string, n *node.Node) { nodes <- n }})
	}()
	var n *node.Node
	select {
	case n = <-nodes:
	case err := <-errc:
		t.Fatalf("pipeline did not start: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("pipeline did not start in time")
	}
	// Once the stages are consuming, the connection closes for good, as
	// nats.go closes it after a server error it cannot recover from.
	for _, doc := range testTools {
		if _, err := n.Store.RegisterTool(context.Background(), []byte(doc), true); err != nil {
			t.Fatal(err)
		}
	}
	if resp := e.invoke(request("acme", "echo", `{"message":"up"}`)); resp.Status != api.StatusSuccess {
		t.Fatalf("before the close: %+v", resp)
	}
	n.NC.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, node.ErrConnectionClosed) {
			t.Fatalf("Run returned %v, want ErrConnectionClosed", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run idles after its connection closed")
	}
}

// TestReusedInvocationIDRefused: a second, different request that reuses an
// id gets E3024, never the first one's result, and leaves its record alone.
func TestReusedInvocationIDRefused(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	first := request("acme", "echo", `{"message":"secret of agent a"}`)
	if _, err := e.client.Invoke(ctx, first, clientOpts("shared")); err != nil {
		t.Fatal(err)
	}
	if resp, err := e.client.Wait(ctx, "acme", "shared"); err != nil || resp.Status != api.StatusSuccess {
		t.Fatalf("first: %+v %v", resp, err)
	}
	second := request("acme", "echo", `{"message":"agent b"}`)
	second.AgentContext.AgentDID = "did:agent:b"
	second.CapabilityToken = tokenFor("acme", "did:agent:b")
	other, err := client.New(e.connect())
	if err != nil {
		t.Fatal(err)
	}
	other.Source = "urn:agent:b"
	if _, err := other.Invoke(ctx, second, clientOpts("shared")); err != nil {
		t.Fatal(err)
	}
	msgs := e.read(subjects.StreamResults, subjects.ResultAnyAgent("acme", "shared"), 2, 30*time.Second)
	resp, err := client.DecodeResult(msgs[1].Data())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(resp.Result), "secret") {
		t.Fatalf("the second request received the first one's result: %s", resp.Result)
	}
	wantCode(t, resp, api.EDuplicateInvocation)
	// One terminal event for the id, the first request's; the refusal is
	// audited as a duplicate.
	eventually(t, 10*time.Second, "the refusal's audit event", func() bool {
		_, d := e.terminalAndDuplicates("acme")
		return d == 1
	})
	if terminal, _ := e.terminalAndDuplicates("acme"); terminal != 1 {
		t.Fatalf("%d terminal events, want 1", terminal)
	}
	rec, err := e.client.Status(ctx, "acme", "shared")
	if err != nil || rec.Status != api.StatusSuccess || rec.Response == nil || !strings.Contains(string(rec.Response.Result), "secret of agent a") {
		t.Fatalf("the first record was changed: %+v %v", rec, err)
	}
}

// TestTenantsShareMsgID: two tenants that send the same Nats-Msg-Id, or the
// same source and id through the client, both get their results.
func TestTenantsShareMsgID(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})
	// Back to back: the invoke stream keeps no window the two could meet in.
	for _, tenant := range []string{"ta", "tb"} {
		h := ceHeader("raw-" + tenant)
		h.Set(nats.MsgIdHdr, "same-msg-id")
		if resp := e.publishRaw("tool.invoke."+tenant, h, echoBody(tenant, "x")); resp.Status != api.StatusSuccess {
			t.Fatalf("tenant %s: %+v", tenant, resp)
		}
	}
	for _, tenant := range []string{"ta", "tb"} {
		resp := e.invoke2(request(tenant, "echo", `{"message":"y"}`), "same-id")
		if resp.Status != api.StatusSuccess {
			t.Fatalf("tenant %s: %+v", tenant, resp)
		}
	}
}

func (e *env) invoke2(req api.Request, id string) api.Response {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.client.Invoke(ctx, req, clientOpts(id)); err != nil {
		e.t.Fatal(err)
	}
	resp, err := e.client.Wait(ctx, req.AgentContext.TenantID, id)
	if err != nil {
		e.t.Fatalf("waiting for %s: %v", id, err)
	}
	return resp
}

// TestUnreadableEventsEndAtOnce: bodies that are not JSON, broken JSON, or
// JSON nested past the decoder's limit end on the first delivery with a
// result on the event's own id and a terminal audit event.
func TestUnreadableEventsEndAtOnce(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})
	deep := strings.Repeat("[", 10001) + strings.Repeat("]", 10001)
	cases := map[string]string{
		"broken":  `{"tool_id": "echo", "parameters": {`,
		"notjson": `hello`,
		"deep":    `{"tool_id":"echo","parameters":{"a":` + deep + `}}`,
	}
	for name, body := range cases { // the env's helpers fail the whole test
		resp := e.publishRaw("tool.invoke.u"+name, ceHeader("unreadable-"+name), []byte(body))
		if resp.InvocationID != "unreadable-"+name {
			t.Fatalf("%s: result for %q", name, resp.InvocationID)
		}
		wantCode(t, resp, api.EInvalidAttribute)
		if ev := e.auditOf("u"+name, 1)[0]; ev.Type() != api.TypeRejected {
			t.Fatalf("%s: audit %s", name, ev.Type())
		}
	}
	// Validate acknowledges each event once its result is stored, a moment
	// after the result is visible: nothing is redelivered, and nothing
	// stays pending.
	var info *jetstream.ConsumerInfo
	eventually(t, 10*time.Second, "validate to acknowledge every event", func() bool {
		var err error
		info, err = e.consumerInfo(subjects.Validate)
		return err == nil && info.NumAckPending == 0
	})
	if info.NumRedelivered != 0 {
		t.Fatalf("validate consumer %+v", info)
	}
}

// TestStructuredWithoutContentType reads a structured event sent with no
// headers at all, and answers a broken one on its own id.
func TestStructuredWithoutContentType(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})
	body := `{"specversion":"1.0","id":"s-1","source":"urn:test","type":"tool.invoke","data":` + string(echoBody("st", "hi")) + `}`
	resp := e.publishRaw("tool.invoke.st", nil, []byte(body))
	if resp.InvocationID != "s-1" || resp.Status != api.StatusSuccess {
		t.Fatalf("response %+v", resp)
	}
	resp = e.publishRaw("tool.invoke.st2", nil, []byte(`{"specversion":"1.0","id":"s-2","data":{}}`))
	if resp.InvocationID != "s-2" {
		t.Fatalf("error went to %q", resp.InvocationID)
	}
	wantCode(t, resp, api.EInvalidAttribute)
}

// TestPercentEncodedHeaders decodes ce-* values percent-encoded as the Python
// SDK sends them.
func TestPercentEncodedHeaders(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})
	h := ceHeader("caf%C3%A9-1")
	h.Set("ce-source", "urn:agent%20a")
	resp := e.publishRaw("tool.invoke.pct", h, echoBody("pct", "x"))
	if resp.InvocationID != "café-1" || resp.Status != api.StatusSuccess {
		t.Fatalf("response %+v", resp)
	}
	ev := e.auditOf("pct", 2)[1]
	var rec envelope.AuditRecord
	if err := ev.DataAs(&rec); err != nil || rec.Source != "urn:agent a" {
		t.Fatalf("audit source %q (%v)", rec.Source, err)
	}
}

// TestCloudEventsSDKSender sends with the CloudEvents Go SDK's NATS JetStream
// protocol, in binary and in forced structured mode.
func TestCloudEventsSDKSender(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})
	sender, err := cejs.NewSenderFromConn(e.nc, subjects.StreamInvoke, subjects.Invoke("sdk"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cloudevents.NewClient(sender)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"binary", "structured"} { // the env's helpers fail the whole test
		func() {
			ev := cloudevents.NewEvent()
			ev.SetID("sdk-" + mode)
			ev.SetSource("urn:sdk")
			ev.SetType(envelope.EventType)
			var data map[string]any
			if err := json.Unmarshal(echoBody("sdk", mode), &data); err != nil {
				t.Fatal(err)
			}
			if err := ev.SetData(cloudevents.ApplicationJSON, data); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if mode == "structured" {
				ctx = binding.WithForceStructured(ctx)
			}
			if res := c.Send(ctx, ev); cloudevents.IsUndelivered(res) {
				t.Fatal(res)
			}
			resp := e.resultOf("sdk", "sdk-"+mode)
			if resp.Status != api.StatusSuccess || !strings.Contains(string(resp.Result), mode) {
				t.Fatalf("%s: response %+v", mode, resp)
			}
		}()
	}
}
