package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"
)

func TestControlService(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	list, err := e.client.ListTools(ctx, api.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var echo *api.ToolSummary
	for i := range list.Tools {
		if list.Tools[i].ToolID == "echo" {
			echo = &list.Tools[i]
		}
	}
	if echo == nil || echo.LatestVersion != "2.0.0" || strings.Join(echo.Versions, ",") != "1.0.0,2.0.0" || list.TotalCount != len(list.Tools) {
		t.Fatalf("listing %+v", list)
	}

	doc := `{"id":"team.greet","name":"greet","version":"0.1.0","description":"says hello","kind":"builtin",
	  "builtin":{"function":"echo"},"input_schema":{"type":"object","required":["message"]},"output_schema":{"type":"object"}}`
	if _, err := e.client.RegisterTool(ctx, []byte(doc), false); err != nil {
		t.Fatal(err)
	}
	_, err = e.client.RegisterTool(ctx, []byte(doc), false)
	var te *api.Error
	if !errors.As(err, &te) || te.ECode != api.EDuplicateTool {
		t.Fatalf("second registration: %v, want E3007", err)
	}
	_, err = e.client.RegisterTool(ctx, []byte(`{"id":"x","version":"one"}`), false)
	if !errors.As(err, &te) || te.ECode != api.EInvalidManifest || len(te.Fields) == 0 {
		t.Fatalf("invalid manifest: %v, want E3008 with fields", err)
	}
	got, err := e.client.GetTool(ctx, "team.greet", "^0.1")
	if err != nil || !strings.Contains(string(got), `"team.greet"`) {
		t.Fatalf("get: %s, %v", got, err)
	}
	// Every worker watches the registry: the new tool is callable at once.
	eventually(t, 5*time.Second, "the new tool to reach every worker", func() bool {
		return e.invoke(request("reg", "team.greet", `{"message":"hi"}`)).Status == api.StatusSuccess
	})

	if _, err := e.client.Status(ctx, "reg", "no-such-invocation"); err == nil {
		t.Fatal("status of an unknown invocation succeeded")
	}
	// `nats micro ls` finds the service through the standard discovery subject:
	// sixteen un-scoped endpoints (models.stats since 1.3; tokens.keys,
	// receipt and tools.purge since 1.7), the tenant-scoped ones
	// (subjects.TenantServices), the administrative ones
	// (subjects.AdminServices) and the re-drive ones.
	msg, err := e.nc.RequestWithContext(ctx, "$SRV.INFO."+subjects.ServiceName, nil)
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Name      string `json:"name"`
		Endpoints []struct {
			Subject string `json:"subject"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal(msg.Data, &info); err != nil || info.Name != subjects.ServiceName || len(info.Endpoints) != 16+len(subjects.TenantServices)+len(subjects.AdminServices) {
		t.Fatalf("service info %s, %v", msg.Data, err)
	}
}

// TestTraceSpansPerStage: with a tracer configured, every stage records a
// span in the caller's trace, and the audit events carry the caller's context.
func TestTraceSpansPerStage(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()); _ = tp.Shutdown(context.Background()) })

	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := e.client.Invoke(ctx, request("trace", "echo", `{"message":"x"}`), clientInvokeOptions{TraceParent: traceparent})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Wait(ctx, "trace", id); err != nil {
		t.Fatal(err)
	}
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	eventually(t, 5*time.Second, "a span from every stage", func() bool {
		seen := map[string]bool{}
		for _, s := range exp.GetSpans() {
			if s.SpanContext.TraceID().String() == traceID {
				seen[s.Name] = true
			}
		}
		return len(seen) == len(subjects.Stages)
	})
	for _, ev := range e.auditOf("trace", 2) {
		tp, _ := ev.Extensions()["traceparent"].(string)
		if tp != traceparent {
			t.Fatalf("audit event %s has traceparent %q: want the caller's %q", ev.Type(), tp, traceparent)
		}
	}
}
