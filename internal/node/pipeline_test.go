package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestEchoEndToEnd(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})

	resp := e.invoke(request("acme", "echo", `{"message":"hello","n":3}`))
	if resp.Status != api.StatusSuccess {
		t.Fatalf("status %s, error %v", resp.Status, resp.Error)
	}
	var got map[string]any
	if err := json.Unmarshal(resp.Result, &got); err != nil || got["message"] != "hello" || got["n"] != float64(3) {
		t.Fatalf("result %s", resp.Result)
	}
	md := resp.ExecutionMetadata
	if md == nil || md.ToolID != "echo" || md.ToolVersion != "2.0.0" || len(md.Stages) != 5 {
		t.Fatalf("execution metadata %+v", md)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := e.client.Status(ctx, "acme", resp.InvocationID)
	if err != nil || rec.Status != api.StatusSuccess || rec.ToolVersion != "2.0.0" {
		t.Fatalf("status record %+v, %v", rec, err)
	}
}

// TestNATSCLIMessage publishes the exact message README's `nats pub` line
// produces, built by hand, and reads the audit events and the result.
func TestNATSCLIMessage(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})

	h := nats.Header{}
	h.Set("ce-specversion", "1.0")
	h.Set("ce-id", "cli-1")
	h.Set("ce-source", "urn:demo")
	h.Set("ce-type", "tool.invoke")
	h.Set("ce-traceparent", traceparent)
	h.Set("content-type", "application/json")
	body := `{"tool_id":"echo","agent_context":{"agent_did":"did:agent:demo","tenant_id":"demo"},"parameters":{"message":"hi"}}`
	resp := e.publishRaw("tool.invoke.demo", h, []byte(withToken(body, "demo", "did:agent:demo")))
	if resp.InvocationID != "cli-1" || resp.Status != api.StatusSuccess || !strings.Contains(string(resp.Result), `"hi"`) {
		t.Fatalf("response %+v result %s", resp, resp.Result)
	}
	events := e.auditOf("demo", 2)
	if events[0].Type() != api.TypeInvoked || events[1].Type() != api.TypeSucceeded {
		t.Fatalf("audit types %s, %s", events[0].Type(), events[1].Type())
	}
	for _, ev := range events {
		tp, _ := ev.Extensions()["traceparent"].(string)
		// The trace id survives every hop even with no tracer configured.
		if !strings.HasPrefix(tp, traceparent[:35]) {
			t.Fatalf("audit event %s lost the trace: traceparent %q", ev.Type(), tp)
		}
		if ev.Subject() != "cli-1" {
			t.Fatalf("audit event subject %q", ev.Subject())
		}
	}
	var rec envelope.AuditRecord
	if err := events[1].DataAs(&rec); err != nil || rec.InvocationID != "cli-1" || rec.Result == nil || rec.AgentDID != "did:agent:demo" {
		t.Fatalf("terminal audit record %+v, %v", rec, err)
	}
}

func TestStructuredMode(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})
	body := `{"specversion":"1.0","id":"s-1","source":"urn:demo","type":"tool.invoke","datacontenttype":"application/json",
	  "data":{"tool_id":"json.transform","agent_context":{"agent_did":"did:agent:demo","tenant_id":"st"},
	          "parameters":{"data":{"a":{"b":[1,2,3]}},"pointer":"/a/b","op":"length"}}}`
	h := nats.Header{}
	h.Set("content-type", "application/cloudevents+json")
	resp := e.publishRaw("tool.invoke.st", h, []byte(withToken(body, "st", "did:agent:demo")))
	if resp.Status != api.StatusSuccess || string(resp.Result) != `{"result":3}` {
		t.Fatalf("response %+v result %s", resp, resp.Result)
	}
}

func TestDeduplicatesRepeatedEvent(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := request("dup", "echo", `{"message":"once"}`)
	for range 3 {
		if _, err := e.client.Invoke(ctx, req, clientOpts("same-id")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.client.Wait(ctx, "dup", "same-id"); err != nil {
		t.Fatal(err)
	}
	// A later, distinct invocation of the same tenant proves the pipeline
	// drained; then exactly one result and one terminal event exist.
	e.invoke(request("dup", "echo", `{"message":"marker"}`))
	if n := e.count(subjects.StreamResults, subjects.ResultAnyAgent("dup", "same-id")); n != 1 {
		t.Fatalf("%d results for one event published three times", n)
	}
	if n := e.count(subjects.StreamAudit, subjects.AuditEvent("dup", "tool.succeeded")); n != 2 {
		t.Fatalf("%d terminal audit events, want 2 (the repeated event and the marker)", n)
	}
}

// TestBadInput sends each kind of bad input and checks the terminal status,
// the stable code, the terminal audit event, and that the pipeline goes on.
func TestBadInput(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{Stage: node.StageConfig{MaxEventBytes: 64 << 10}})

	binary := func(tenant, typ, data string, drop ...string) (string, nats.Header, []byte) {
		h := nats.Header{}
		h.Set("ce-specversion", "1.0")
		h.Set("ce-id", "bad-"+tenant)
		h.Set("ce-source", "urn:test")
		h.Set("ce-type", typ)
		h.Set("content-type", "application/json")
		for _, d := range drop {
			h.Del(d)
		}
		return "tool.invoke." + tenant, h, []byte(data)
	}
	data := func(tenant, tool, version, params string) string {
		return withToken(fmt.Sprintf(`{"tool_id":%q,"tool_version":%q,"agent_context":{"agent_did":"did:agent:x","tenant_id":%q},"parameters":%s}`,
			tool, version, tenant, params), tenant, "did:agent:x")
	}
	structured := nats.Header{"content-type": {"application/cloudevents+json"}}
	cases := []struct {
		name       string
		msg        func() (string, nats.Header, []byte)
		status     api.Status
		code       api.Code
		ecode      string
		auditType  string
		wantFields bool
	}{
		{"malformed JSON", func() (string, nats.Header, []byte) {
			return "tool.invoke.b1", structured, []byte(`{"specversion":"1.0", "id": `)
		}, api.StatusError, api.InvalidParameters, api.EMalformedEvent, api.TypeRejected, false},
		{"not a CloudEvent", func() (string, nats.Header, []byte) {
			return "tool.invoke.b2", nil, []byte(data("b2", "echo", "", `{"message":"x"}`))
		}, api.StatusError, api.InvalidParameters, api.EMalformedEvent, api.TypeRejected, false},
		{"missing required attribute", func() (string, nats.Header, []byte) {
			return binary("b3", "tool.invoke", data("b3", "echo", "", `{"message":"x"}`), "ce-source")
		}, api.StatusError, api.InvalidParameters, api.EInvalidAttribute, api.TypeRejected, true},
		{"wrong type", func() (string, nats.Header, []byte) {
			return binary("b4", "com.example.other", data("b4", "echo", "", `{"message":"x"}`))
		}, api.StatusError, api.InvalidParameters, api.EWrongEventType, api.TypeRejected, false},
		{"tenant mismatch", func() (string, nats.Header, []byte) {
			return binary("b5", "tool.invoke", data("someone-else", "echo", "", `{"message":"x"}`))
		}, api.StatusPermissionDenied, api.PermissionDenied, api.ETenantMismatch, api.TypePermissionDenied, false},
		{"unknown tool", func() (string, nats.Header, []byte) {
			return binary("b6", "tool.invoke", data("b6", "no.such.tool", "", `{}`))
		}, api.StatusError, api.ToolNotFound, api.EToolNotFound, api.TypeRejected, false},
		{"unknown version", func() (string, nats.Header, []byte) {
			return binary("b7", "tool.invoke", data("b7", "echo", "9.9.9", `{"message":"x"}`))
		}, api.StatusError, api.ToolVersionNotFound, api.EVersionNotFound, api.TypeRejected, false},
		{"unsatisfiable range", func() (string, nats.Header, []byte) {
			return binary("b8", "tool.invoke", data("b8", "echo", "^7", `{"message":"x"}`))
		}, api.StatusError, api.ToolVersionNotFound, api.EVersionUnsatisfied, api.TypeRejected, false},
		{"parameters fail the schema", func() (string, nats.Header, []byte) {
			return binary("b9", "tool.invoke", data("b9", "sleep", "", `{"ms":"soon"}`))
		}, api.StatusError, api.InvalidParameters, api.EParametersInvalid, api.TypeRejected, true},
		{"request fails the schema", func() (string, nats.Header, []byte) {
			return binary("b10", "tool.invoke", `{"tool_id":"echo","agent_context":{"agent_did":"d","tenant_id":"b10"},"surprise":1}`)
		}, api.StatusError, api.InvalidParameters, api.ERequestInvalid, api.TypeRejected, true},
		{"oversized event", func() (string, nats.Header, []byte) {
			big := `{"message":"` + strings.Repeat("x", 100<<10) + `"}`
			return binary("b11", "tool.invoke", data("b11", "echo", "", big))
		}, api.StatusError, api.InvalidParameters, api.EPayloadTooLarge, api.TypeRejected, false},
		{"tool panics", func() (string, nats.Header, []byte) {
			return binary("b12", "tool.invoke", data("b12", "test.boom", "", `{}`))
		}, api.StatusError, api.ToolExecutionError, api.EToolPanicked, api.TypeFailed, false},
		{"tool exceeds its timeout", func() (string, nats.Header, []byte) {
			d := `{"tool_id":"sleep","agent_context":{"agent_did":"d","tenant_id":"b13"},"parameters":{"ms":5000},"resource_limits":{"timeout_seconds":1}}`
			return binary("b13", "tool.invoke", withToken(d, "b13", "d"))
		}, api.StatusTimeout, api.Timeout, api.ETimeout, api.TypeTimeout, false},
		{"result lacks a field its output schema requires", func() (string, nats.Header, []byte) {
			return binary("b14", "tool.invoke", data("b14", "test.bad_output", "", `{}`))
		}, api.StatusError, api.ToolExecutionError, api.EResultMissingField, api.TypeFailed, true},
		{"removed version", func() (string, nats.Header, []byte) {
			return binary("b15", "tool.invoke", data("b15", "test.removed", "1.0.0", `{}`))
		}, api.StatusError, api.ToolVersionNotFound, api.EToolRemoved, api.TypeFailed, false},
		{"no executor for the kind", func() (string, nats.Header, []byte) {
			return binary("b16", "tool.invoke", data("b16", "test.model", "", `{}`))
		}, api.StatusError, api.ToolExecutionError, api.EExecutorUnavailable, api.TypeFailed, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.t = t
			subject, h, body := c.msg()
			resp := e.publishRaw(subject, h, body)
			if resp.Status != c.status || resp.Error == nil || resp.Error.Code != c.code || resp.Error.ECode != c.ecode {
				t.Fatalf("got %s %s, want %s %s/%s", resp.Status, mustJSON(t, resp.Error), c.status, c.code, c.ecode)
			}
			if c.wantFields && len(resp.Error.Fields) == 0 {
				t.Fatalf("no field-level details: %s", mustJSON(t, resp.Error))
			}
			if len(resp.Result) != 0 {
				t.Fatalf("a failed invocation carried a result: %s", resp.Result)
			}
			tenant := strings.TrimPrefix(subject, "tool.invoke.")
			if n := e.count(subjects.StreamAudit, subjects.AuditEvent(tenant, envelope.SubjectSuffix(c.auditType))); n != 1 {
				t.Fatalf("%d %s audit events for tenant %s, want 1", n, c.auditType, tenant)
			}
		})
	}
	e.t = t
	// The pipeline is unharmed: a good call still succeeds.
	if resp := e.invoke(request("after", "echo", `{"message":"still here"}`)); resp.Status != api.StatusSuccess {
		t.Fatalf("after bad input: %+v", resp)
	}
}

func TestDeprecatedVersionWarns(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})
	req := request("dep", "echo", `{"message":"old"}`)
	req.ToolVersion = "~1.0"
	resp := e.invoke(req)
	if resp.Status != api.StatusSuccess || resp.ExecutionMetadata.ToolVersion != "1.0.0" {
		t.Fatalf("response %+v", resp)
	}
	w := resp.ExecutionMetadata.Warnings
	if len(w) != 1 || !strings.Contains(w[0], "deprecated") || !strings.Contains(w[0], "2.0.0") {
		t.Fatalf("warnings %q", w)
	}
}

func clientOpts(id string) clientInvokeOptions { return clientInvokeOptions{ID: id} }
