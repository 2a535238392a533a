package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// maxDeliveriesAdvisory is the part of JetStream's advisory we read.
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// watchExhausted ends invocations whose message reached the consumer's
// delivery limit without being settled (a worker crashed or hung on every
// delivery): JetStream then leaves the message in the stream and publishes an
// advisory. One worker of the stage (a queue group) reads the message,
// hands it to audit as internal_error E3901 and deletes it.
func (r *Runner) watchExhausted(ctx context.Context) ([]*nats.Subscription, error) {
	if r.NoSettle {
		return nil, nil
	}
	nc := r.JS.Conn()
	var subs []*nats.Subscription
	if r.SweepAlso != nil {
		// The sites come and go while this runs: one subscription for every
		// consumer of the pipeline, acting on theirs only.
		sub, err := nc.QueueSubscribe(subjects.MaxDeliveriesAdvisory(subjects.Input{Stream: subjects.StreamPipeline, Consumer: "*"}), "toolgate-"+r.Name+"-sites", func(m *nats.Msg) {
			var adv maxDeliveriesAdvisory
			if err := json.Unmarshal(m.Data, &adv); err != nil {
				r.Log.Warn("unreadable advisory", "err", err)
				return
			}
			if slices.ContainsFunc(r.SweepAlso(), func(in subjects.Input) bool { return in.Stream == adv.Stream && in.Consumer == adv.Consumer }) {
				r.endExhaustedRetrying(ctx, adv)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("watching the sites' delivery advisories: %w", err)
		}
		subs = append(subs, sub)
	}
	for _, in := range r.inputs() {
		sub, err := nc.QueueSubscribe(subjects.MaxDeliveriesAdvisory(in), "toolgate-"+r.Name, func(m *nats.Msg) {
			var adv maxDeliveriesAdvisory
			if err := json.Unmarshal(m.Data, &adv); err != nil {
				r.Log.Warn("unreadable advisory", "err", err)
				return
			}
			r.endExhaustedRetrying(ctx, adv)
		})
		if err != nil {
			unsubscribe(subs)
			return nil, fmt.Errorf("watching delivery advisories: %w", err)
		}
		subs = append(subs, sub)
	}
	return subs, nil
}

func unsubscribe(subs []*nats.Subscription) {
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
}

// endExhaustedRetrying ends the exhausted message of adv, trying again with
// backoff until it succeeds or ctx ends. The advisory is sent once: a
// message past its delivery limit is never delivered again, so giving up
// after a failed attempt (the stream's leader being elected, say) would
// leave its invocation without an ending for good. It runs on the advisory
// subscription's goroutine; later advisories wait in its queue.
func (r *Runner) endExhaustedRetrying(ctx context.Context, adv maxDeliveriesAdvisory) {
	for attempt := 1; ; attempt++ {
		err := r.endExhausted(ctx, adv, false)
		if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) {
			return // ended, now or by an earlier attempt that deleted it
		}
		if errors.Is(err, errEndedNotDeleted) {
			r.Log.Error("deleting exhausted message; the sweep will", "seq", adv.StreamSeq, "err", err)
			return
		}
		r.Log.Error("ending exhausted message", "seq", adv.StreamSeq, "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff(attempt)):
		}
	}
}

// endExhausted hands the invocation of the message adv names to audit as
// E3901 (at audit itself, or when the message cannot be read, records it as
// poison) and deletes the message. swept says the sweep, not the advisory,
// found it. It gives up when ctx ends: a message it leaves is found again
// by the next sweep.
func (r *Runner) endExhausted(ctx context.Context, adv maxDeliveriesAdvisory, swept bool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := r.JS.Stream(ctx, adv.Stream)
	if err != nil {
		return err
	}
	raw, err := stream.GetMsg(ctx, adv.StreamSeq)
	if err != nil {
		return fmt.Errorf("reading message %d: %w", adv.StreamSeq, err)
	}
	inv, _ := r.decode(raw.Subject, raw.Header, raw.Data, raw.Sequence)
	if inv == nil || r.finalises() {
		// Audit itself could not finish it: record it as poison, the
		// last-resort audit trail.
		o, err := poisonEvent(r.Name, raw.Subject, adv.Stream, raw.Sequence,
			fmt.Errorf("not settled after %d deliveries", adv.Deliveries))
		if err != nil {
			return err
		}
		if err := r.publish(ctx, o); err != nil {
			return err
		}
	} else {
		if !inv.Terminal() {
			e := api.NewError(api.InternalError, api.EDeliveryExhausted,
				"%s did not settle the invocation after %d deliveries", r.Name, adv.Deliveries)
			if swept {
				e = e.WithDetail(stages.SweptDetail, true)
			}
			inv.Fail(r.Name, e)
		}
		o, err := r.handoff(inv, subjects.Audit)
		if err != nil {
			return err
		}
		if err := r.publish(ctx, o); err != nil {
			return err
		}
	}
	if err := r.deleteLeftover(ctx, stream, adv.Stream, adv.StreamSeq); err != nil {
		return fmt.Errorf("%w: %w", errEndedNotDeleted, err)
	}
	return nil
}

// errEndedNotDeleted: the invocation was handed on, its message not
// deleted. The sweep deletes it later, once the invocation's record shows
// the ending.
var errEndedNotDeleted = errors.New("ended, not deleted")

// poisonEvent is the audit record of a message that could not be read.
func poisonEvent(stage, subject, stream string, seq uint64, cause error) (stages.Output, error) {
	tenant := subject[strings.LastIndexByte(subject, '.')+1:]
	if subjects.CheckTenant(tenant) != nil {
		tenant = subjects.SystemTenant // no subject can be built from it
	}
	return poisonEventFor(tenant, stage, subject, stream, seq, cause)
}

// refusedSender reports the codes of a message refused for who sent it:
// unsigned, an ending its sender may not make, an event its sender's role
// does not emit, a site's hand-off of a call not its own.
func refusedSender(code string) bool {
	return code == api.EMessageUnsigned || code == api.EEndingRefused || code == api.ERelayRefused || code == api.ESiteHandOffRefused
}

// poisonEventFor is poisonEvent in tenant's trail.
func poisonEventFor(tenant, stage, subject, stream string, seq uint64, cause error) (stages.Output, error) {
	e := event.New()
	e.SetID(fmt.Sprintf("%s-%d", stream, seq))
	e.SetSource("urn:toolgate:" + stage)
	e.SetType(api.TypePoison)
	e.SetTime(time.Now().UTC())
	e.SetExtension("tenantid", tenant)
	perr := api.NewError(api.InternalError, api.EPoisonMessage, "%v", cause)
	if ae, ok := cause.(*api.Error); ok && refusedSender(ae.ECode) {
		perr = ae // a refused sender keeps its own code
	}
	err := e.SetData(event.ApplicationJSON, map[string]any{
		"stage": stage, "subject": subject, "stream": stream, "stream_seq": seq,
		"error": perr,
	})
	if err != nil {
		return stages.Output{}, err
	}
	return stages.EventOutput(subjects.AuditEvent(tenant, envelope.SubjectSuffix(api.TypePoison)), &e)
}
