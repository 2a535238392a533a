package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	"github.com/toolgate/toolgate/subjects"
)

// TestExhaustedMessageEndsAfterFailedAttempts: the max-deliveries advisory
// comes once, so a failed attempt to end the message (here the stream is
// not there yet, as during a leader election) is retried until the
// invocation is handed to audit and the message deleted.
func TestExhaustedMessageEndsAfterFailedAttempts(t *testing.T) {
	_, js := natstest.JetStream(t)
	r := &Runner{Name: subjects.Execute, JS: js, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The message is in the pipeline stream from the start, but the stream
	// takes no hand-offs to audit yet (as while a stream is being placed):
	// every attempt fails until it does, and none may give up.
	if err := topology.EnsureTopology(ctx, js, topology.TopologyOptions{}); err != nil {
		t.Fatal(err)
	}
	pipeline, err := js.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		t.Fatal(err)
	}
	cfg := pipeline.CachedInfo().Config
	if err := js.DeleteStream(ctx, subjects.StreamPipeline); err != nil {
		t.Fatal(err)
	}
	narrow := cfg
	narrow.Subjects = []string{subjects.PipeStage(subjects.Execute)}
	if _, err := js.CreateStream(ctx, narrow); err != nil {
		t.Fatal(err)
	}
	inv := envelope.Invocation{ID: "inv-1", Tenant: "acme", Event: envelope.Event{Seq: 1}}
	data, _ := json.Marshal(inv)
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subjects.Pipe(subjects.Execute, "normal", "acme"), Data: data}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.endExhaustedRetrying(ctx, maxDeliveriesAdvisory{Stream: subjects.StreamPipeline, StreamSeq: 1, Deliveries: 5})
	}()
	time.Sleep(500 * time.Millisecond) // a few attempts fail meanwhile
	select {
	case <-done:
		t.Fatal("gave up while the hand-off could not be stored")
	default:
	}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the exhausted message was never ended")
	}
	stream, err := js.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.GetMsg(ctx, 1); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("exhausted message still there: %v", err)
	}
	m, err := stream.GetLastMsgForSubject(ctx, subjects.Pipe(subjects.Audit, "normal", "acme"))
	if err != nil {
		t.Fatalf("no hand-off to audit: %v", err)
	}
	var ended envelope.Invocation
	if err := json.Unmarshal(m.Data, &ended); err != nil || ended.Error == nil || ended.Error.ECode != api.EDeliveryExhausted {
		t.Fatalf("hand-off to audit: %s (%v)", m.Data, err)
	}
}

// TestSiteExhaustedEndedByHub: a site's worker may not read or delete a
// pipeline message by sequence (NoSettle), so it does not watch its
// consumers' delivery limit; the hub's execute does (SweepAlso): a site's
// call that reached the limit ends E3901 and its message goes.
func TestSiteExhaustedEndedByHub(t *testing.T) {
	_, js := natstest.JetStream(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := topology.TopologyOptions{AckWait: 200 * time.Millisecond, MaxDeliver: 2}
	if err := topology.EnsureTopology(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	if err := topology.EnsureSites(ctx, js, o, []string{"lab-eu"}); err != nil {
		t.Fatal(err)
	}
	site := &Runner{Name: subjects.Execute, JS: js, Log: log, Inputs: subjects.SiteInputs("lab-eu"), NoSettle: true}
	if subs, err := site.watchExhausted(ctx); err != nil || len(subs) != 0 {
		t.Fatalf("the site's worker watches %d advisories (%v), want none", len(subs), err)
	}
	hub := &Runner{Name: subjects.Execute, JS: js, Log: log, SweepAlso: func() []subjects.Input { return subjects.SiteInputs("lab-eu") }}
	subs, err := hub.watchExhausted(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer unsubscribe(subs)
	inv := envelope.Invocation{ID: "inv-site", Tenant: "acme", Event: envelope.Event{Seq: 1}, Route: &envelope.Route{ToolID: "t", Site: "lab-eu"}}
	data, _ := json.Marshal(inv)
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: subjects.PipeSite("lab-eu", "normal", "acme"), Data: data})
	if err != nil {
		t.Fatal(err)
	}
	// The site's worker takes it and never settles it, as one that dies
	// on every delivery.
	in := subjects.SiteInputs("lab-eu")[1]
	c, err := js.Consumer(ctx, in.Stream, in.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := stream.GetMsg(ctx, ack.Sequence); errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the hub never ended the site's exhausted call")
		}
		b, err := c.Fetch(1, jetstream.FetchMaxWait(300*time.Millisecond))
		if err == nil {
			for range b.Messages() {
			}
		}
	}
	m, err := stream.GetLastMsgForSubject(ctx, subjects.Pipe(subjects.Audit, "normal", "acme"))
	if err != nil {
		t.Fatalf("no hand-off to audit: %v", err)
	}
	var ended envelope.Invocation
	if err := json.Unmarshal(m.Data, &ended); err != nil || ended.ID != inv.ID || ended.Error == nil || ended.Error.ECode != api.EDeliveryExhausted {
		t.Fatalf("hand-off to audit: %s (%v)", m.Data, err)
	}
}

// TestEndWaitingRemovedSite: the calls waiting for a removed site, queued
// or taken by its worker and never settled, end E3273 at audit from the
// hub's execute and leave the pipeline; another site's call stays.
func TestEndWaitingRemovedSite(t *testing.T) {
	_, js := natstest.JetStream(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := topology.TopologyOptions{AckWait: time.Minute}
	if err := topology.EnsureTopology(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	if err := topology.EnsureSites(ctx, js, o, []string{"lab-eu", "lab-us"}); err != nil {
		t.Fatal(err)
	}
	publish := func(id, site, prio string) uint64 {
		inv := envelope.Invocation{ID: id, Tenant: "acme", Event: envelope.Event{Seq: 1}, Route: &envelope.Route{ToolID: "t", Site: site}}
		data, _ := json.Marshal(inv)
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: subjects.PipeSite(site, prio, "acme"), Data: data})
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	var eu []uint64
	for i, prio := range []string{"high", "normal", "normal", "low"} {
		eu = append(eu, publish(fmt.Sprintf("eu-%d", i), "lab-eu", prio))
	}
	other := publish("us-0", "lab-us", "normal")
	// lab-eu's worker took one and never settled it.
	in := subjects.SiteInputs("lab-eu")[0]
	c, err := js.Consumer(ctx, in.Stream, in.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Fetch(1, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for range b.Messages() {
	}

	hub := &Runner{Name: subjects.Execute, JS: js, Log: log}
	n, err := hub.EndWaiting(ctx, js, subjects.StreamPipeline, subjects.PipeSiteAll("lab-eu"),
		api.NewError(api.ToolExecutionError, api.ESiteRemoved, "removed"))
	if err != nil || n != len(eu) {
		t.Fatalf("EndWaiting: %d ended, %v; want %d", n, err, len(eu))
	}
	stream, err := js.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range eu {
		if _, err := stream.GetMsg(ctx, seq); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Errorf("lab-eu's call at %d still in the pipeline: %v", seq, err)
		}
	}
	if _, err := stream.GetMsg(ctx, other); err != nil {
		t.Errorf("lab-us's call: %v, want it waiting still", err)
	}
	ended := map[string]bool{}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		if stage, _ := subjects.StageOfPipe(m.Subject); stage != subjects.Audit {
			continue
		}
		var inv envelope.Invocation
		if err := json.Unmarshal(m.Data, &inv); err == nil && inv.Error != nil && inv.Error.ECode == api.ESiteRemoved && inv.EndedBy == subjects.Execute {
			ended[inv.ID] = true
		}
	}
	if len(ended) != len(eu) || ended["us-0"] {
		t.Errorf("calls ended E3273 at audit: %v, want lab-eu's %d", ended, len(eu))
	}
}
