package runner

import (
	"context"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/stages"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// sentJS acknowledges every publish at once and keeps what was sent.
type sentJS struct {
	jetstream.JetStream
	mu   sync.Mutex
	sent []*nats.Msg
}

func (js *sentJS) PublishMsgAsync(m *nats.Msg, _ ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	js.mu.Lock()
	defer js.mu.Unlock()
	js.sent = append(js.sent, m)
	return ackedFuture{}, nil
}

// traceStage keeps the trace context its stage ran under.
type traceStage struct{ sc *trace.SpanContext }

func (s traceStage) Process(ctx context.Context, _ *envelope.Invocation) ([]stages.Output, error) {
	*s.sc = trace.SpanContextFromContext(ctx)
	return nil, nil
}

// handOn runs route's Runner over a hand-off carrying traceparent (none
// when ""), and returns the hand-off it sent on, and the trace context
// its stage ran under.
func handOn(t *testing.T, traceparent string) (*envelope.Invocation, trace.SpanContext) {
	t.Helper()
	js := &sentJS{}
	r, msg := routeHop(t, js)
	var sc trace.SpanContext
	r.Stage = traceStage{&sc}
	if traceparent != "" {
		inv, err := envelope.Decode(msg.data)
		if err != nil {
			t.Fatal(err)
		}
		inv.TraceParent, inv.Origin.TraceParent = traceparent, traceparent
		o, err := Handoff(inv, r.Name)
		if err != nil {
			t.Fatal(err)
		}
		msg.data = o.Data
	}
	var settling sync.WaitGroup
	r.handle(msg, &settling, func() {})
	settling.Wait()
	if len(js.sent) != 1 {
		t.Fatalf("sent %d messages, want the hand-off", len(js.sent))
	}
	out, err := envelope.Decode(js.sent[0].Data)
	if err != nil {
		t.Fatal(err)
	}
	if got := js.sent[0].Header.Get("traceparent"); got != out.TraceParent {
		t.Fatalf("hand-off's traceparent header %q, its invocation's %q", got, out.TraceParent)
	}
	return out, sc
}

const callerTrace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// TestHopTraceUntraced: with no tracer provider installed, or a no-op
// one, a hop starts no span, yet hands on the caller's trace context as it
// came, and makes up none for a call that came without one.
func TestHopTraceUntraced(t *testing.T) {
	check := func(t *testing.T) {
		if !tracingOff() {
			t.Fatal("tracing is on with no tracer provider")
		}
		if out, sc := handOn(t, ""); out.TraceParent != "" || out.Origin.TraceParent != "" || sc.IsValid() {
			t.Fatalf("an untraced call handed on trace context %q (origin %q), ran under %v", out.TraceParent, out.Origin.TraceParent, sc)
		}
		out, sc := handOn(t, callerTrace)
		if out.TraceParent != callerTrace || out.Origin.TraceParent != callerTrace {
			t.Fatalf("the caller's trace %s handed on as %q (origin %q)", callerTrace, out.TraceParent, out.Origin.TraceParent)
		}
		if sc.TraceID().String() != callerTrace[3:35] || sc.SpanID().String() != callerTrace[36:52] {
			t.Fatalf("the stage ran under %v, not the caller's trace", sc)
		}
	}
	if otel.GetTracerProvider() == unsetProvider {
		t.Run("unset", check)
	}
	otel.SetTracerProvider(noop.NewTracerProvider())
	t.Run("noop", check)
}

// TestHopTraceTraced: with a tracer provider, each hop records a span in
// the caller's trace and hands on its own context; a call that came
// without one starts a trace at its first hop, its origin.
func TestHopTraceTraced(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()); _ = tp.Shutdown(context.Background()) })
	if tracingOff() {
		t.Fatal("tracing is off under an SDK tracer provider")
	}

	out, ran := handOn(t, callerTrace)
	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans recorded, want the hop's", len(spans))
	}
	sc := spans[0].SpanContext()
	if sc.TraceID().String() != callerTrace[3:35] || spans[0].Parent().SpanID().String() != callerTrace[36:52] {
		t.Fatalf("the hop's span %v is not the caller's child", sc)
	}
	if want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"; out.TraceParent != want || !ran.Equal(sc) {
		t.Fatalf("handed on traceparent %q, ran under %v, want the hop's span's %q", out.TraceParent, ran, want)
	}
	if out.Origin.TraceParent != callerTrace {
		t.Fatalf("origin %q, want the caller's", out.Origin.TraceParent)
	}

	out, _ = handOn(t, "")
	spans = rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans recorded, want two hops'", len(spans))
	}
	sc = spans[1].SpanContext()
	if want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"; out.TraceParent != want || out.Origin.TraceParent != want {
		t.Fatalf("a call without a trace handed on %q (origin %q), want its first span's %q", out.TraceParent, out.Origin.TraceParent, want)
	}
}
