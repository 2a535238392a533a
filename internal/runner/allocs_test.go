package runner

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/allocbudget"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
	"go.opentelemetry.io/otel"
)

// The runner's per-message path, fetch to ack, with a stage that does
// nothing and a bus that acknowledges at once: what the Runner itself
// allocates for every message of every stage (the NATS client's own work
// is not counted).
var runnerBudgets = map[string]float64{
	"forward": 18,
	// A hop as serve makes it, route to execute in one process: signed
	// (a MAC), published, read back and taken, with a 1.5 KB request.
	"signed": 17,
}

type passStage struct{}

func (passStage) Process(context.Context, *envelope.Invocation) ([]stages.Output, error) {
	return nil, nil
}

// ackedJS acknowledges every publish at once.
type ackedJS struct{ jetstream.JetStream }

func (ackedJS) PublishMsgAsync(*nats.Msg, ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	return ackedFuture{}, nil
}

var ackedOk = func() chan *jetstream.PubAck {
	c := make(chan *jetstream.PubAck)
	close(c)
	return c
}()

type ackedFuture struct{}

func (ackedFuture) Ok() <-chan *jetstream.PubAck { return ackedOk }
func (ackedFuture) Err() <-chan error            { return nil }
func (ackedFuture) Msg() *nats.Msg               { return nil }

// heldMsg is a delivered message that settles without a server.
type heldMsg struct {
	jetstream.Msg
	data []byte
	md   *jetstream.MsgMetadata
}

func (m *heldMsg) Metadata() (*jetstream.MsgMetadata, error) { return m.md, nil }
func (m *heldMsg) Subject() string                           { return "toolgate.pipe.route.normal.acme" }
func (m *heldMsg) Headers() nats.Header                      { return nil }
func (m *heldMsg) Data() []byte                              { return m.data }
func (m *heldMsg) Ack() error                                { return nil }
func (m *heldMsg) InProgress() error                         { return nil }

// routeHop is a delivered hand-off to route and a Runner of route over js
// that settles it without a server.
func routeHop(tb testing.TB, js jetstream.JetStream) (*Runner, *heldMsg) {
	tb.Helper()
	inv := &envelope.Invocation{ID: "inv-1", Tenant: "acme", Status: api.StatusPending, Event: envelope.Event{Seq: 5},
		Request: &api.Request{ToolID: "echo", Parameters: []byte(`{"text":"hi"}`),
			AgentContext: api.AgentContext{AgentDID: "did:agent:a", TenantID: "acme"}}}
	in, err := Handoff(inv, subjects.Route)
	if err != nil {
		tb.Fatal(err)
	}
	r := &Runner{Name: subjects.Route, Stage: passStage{}, JS: js, AckWait: 30 * time.Second,
		MaxDeliver: 5, Timeout: 30 * time.Second, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	r.tracer, r.spanName = otel.Tracer(tracerName), "toolgate."+r.Name // as Run sets them
	r.Metrics = NewMetrics(prometheus.NewRegistry())
	r.inMemory, r.inflight = r.Metrics.inMemory.WithLabelValues(r.Name), r.Metrics.inflight.WithLabelValues(r.Name)
	r.series = r.Metrics.seriesOf(r.Name)
	msg := &heldMsg{data: in.Data, md: &jetstream.MsgMetadata{NumDelivered: 1, Stream: subjects.StreamPipeline,
		Sequence: jetstream.SequencePair{Stream: 9}}}
	return r, msg
}

func runnerPaths(tb testing.TB) map[string]func() {
	tb.Helper()
	r, msg := routeHop(tb, ackedJS{})
	hop, execute, _, _ := signedHop(tb)
	return map[string]func(){
		"signed": func() {
			m := hop()
			if inv, err := execute.decode(m.Subject, m.Header, m.Data, 10); inv == nil {
				tb.Fatal(err)
			}
		},
		"forward": func() {
			var settling sync.WaitGroup
			r.handle(msg, &settling, func() {})
			settling.Wait()
		},
	}
}

// TestAllocationBudget fails when the runner's per-message path allocates
// more than its recorded budget by over allocbudget.Tolerance.
func TestAllocationBudget(t *testing.T) { allocbudget.Check(t, runnerBudgets, runnerPaths(t)) }

func BenchmarkHandle(b *testing.B) { allocbudget.Bench(b, runnerPaths(b)) }
