package runner

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

type refusingFinaliser struct{ finalStage }

func (refusingFinaliser) Process(context.Context, *envelope.Invocation) ([]stages.Output, error) {
	return nil, errors.New("cannot record this ending")
}

// TestFinaliserRecordsWhatItGivesUpOn: nothing follows audit, so a message
// it terminates is first recorded on the audit trail as poison, never
// dropped without a trace.
func TestFinaliserRecordsWhatItGivesUpOn(t *testing.T) {
	_, js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := topology.EnsureTopology(ctx, js, topology.TopologyOptions{}); err != nil {
		t.Fatal(err)
	}
	inv := envelope.Invocation{ID: "inv-1", Tenant: "acme", Event: envelope.Event{Seq: 1}}
	data, _ := json.Marshal(inv)
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subjects.Pipe(subjects.Audit, subjects.PriorityNormal, "acme"), Data: data}); err != nil {
		t.Fatal(err)
	}
	r := &Runner{Name: subjects.Audit, Stage: refusingFinaliser{}, JS: js, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(rctx) }()
	defer func() { stop(); <-done }()
	audit, err := js.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	poison := subjects.AuditEvent("acme", envelope.SubjectSuffix(api.TypePoison))
	natstest.Eventually(t, 30*time.Second, func() bool {
		_, err := audit.GetLastMsgForSubject(ctx, poison)
		return err == nil
	}, "a poison audit event")
	pipeline, err := js.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool {
		_, err := pipeline.GetMsg(ctx, 1)
		return errors.Is(err, jetstream.ErrMsgNotFound)
	}, "the terminated message to leave the work queue")
}
