package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// Relaying returns js with every publish onto an audit event or result
// subject sent to the relay instead (subjects.Relay): only audit may
// publish those, and audit publishes what the relay holds once it has
// checked who sent it (Relay). Signing goes under it, so a signature
// covers the relay subject the message travels on.
func Relaying(js jetstream.JetStream) jetstream.JetStream { return &relayingJS{JetStream: js} }

type relayingJS struct{ jetstream.JetStream }

func relayed(m *nats.Msg) *nats.Msg {
	if !subjects.Relayed(m.Subject) {
		return m
	}
	return &nats.Msg{Subject: subjects.Relay(m.Subject), Reply: m.Reply, Header: m.Header, Data: m.Data}
}

func (j *relayingJS) Publish(ctx context.Context, subject string, data []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return j.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data}, opts...)
}

func (j *relayingJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return j.JetStream.PublishMsg(ctx, relayed(m), opts...)
}

func (j *relayingJS) PublishAsync(subject string, data []byte, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	return j.PublishMsgAsync(&nats.Msg{Subject: subject, Data: data}, opts...)
}

func (j *relayingJS) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	return j.JetStream.PublishMsgAsync(relayed(m), opts...)
}

// PublishOwnedAsync is PublishMsgAsync for a message the caller made for
// this publish alone (seal.OwnedPublisher): redirected in place.
func (j *relayingJS) PublishOwnedAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if subjects.Relayed(m.Subject) {
		m.Subject = subjects.Relay(m.Subject)
	}
	return seal.PublishOwnedAsync(j.JetStream, m, opts...)
}

// Relay is audit's other consumer: it publishes the audit events and
// results the other roles emit on the relay, each on its own subject with
// its own message id, once Senders (when set) has checked that a role that
// emits that subject signed it. A message that fails the check is poison:
// recorded, never published. A relayed result (the pending answer of an
// async call) is published only while its subject holds nothing: the call
// may have ended, and its terminal result been stored, before the relay
// got to it.
type Relay struct {
	// JS is audit's: what it publishes is audit's to publish.
	JS      jetstream.JetStream
	Senders func(subject string, h nats.Header, data []byte) (ours bool, err error)
	Workers int // default 8
	Log     *slog.Logger
	Metrics *Metrics
}

// relayStage names the relay in poison records and metrics.
const relayStage = subjects.Audit + "-relay"

// Run relays until ctx is done.
func (r *Relay) Run(ctx context.Context) error {
	log := cmpLog(r.Log).With("stage", relayStage)
	var cons jetstream.Consumer
	err := topology.Retry(ctx, log, "opening consumer "+subjects.RelayInput.Consumer, func(ctx context.Context) (err error) {
		cons, err = r.JS.Consumer(ctx, subjects.RelayInput.Stream, subjects.RelayInput.Consumer)
		return err
	})
	if err != nil {
		return nil // stopped before it started
	}
	workers := r.Workers
	if workers < 1 {
		workers = 8
	}
	work := make(chan jetstream.Msg)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for m := range work {
				r.relay(log, m)
			}
		})
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case work <- m:
		case <-ctx.Done():
			_ = m.Nak()
		}
	}, jetstream.PullMaxMessages(2*workers))
	if err == nil {
		<-ctx.Done()
		cc.Drain()
		<-cc.Closed()
	}
	close(work)
	wg.Wait()
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("consuming the relay: %w", err)
	}
	return nil
}

func cmpLog(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}

func (r *Relay) relay(log *slog.Logger, m jetstream.Msg) {
	md, err := m.Metadata()
	if err != nil {
		_ = m.Term()
		return
	}
	subject, ok := subjects.Unrelay(m.Subject())
	if !ok {
		r.refuse(log, m, md, "", errors.New("not a relayed audit event or result"))
		return
	}
	ours := true // without Senders, no one's key is checked and no one's rights
	if r.Senders != nil {
		var err error
		if ours, err = r.Senders(m.Subject(), m.Headers(), m.Data()); err != nil {
			r.refuse(log, m, md, subject, err)
			return
		}
	}
	if subjects.IsResult(subject) && !pendingAnswer(m.Data()) {
		// The one result another role emits is validate's pending answer:
		// a final result is audit's alone, whoever signed this one.
		r.refuse(log, m, md, subject, api.NewError(api.PermissionDenied, api.EMessageUnsigned,
			"refused a relayed result: only a pending answer (%s) may be relayed, never a final result", api.TypeAccepted))
		return
	}
	if !ours {
		// What a role of this process signed its own code wrote; another
		// host's key vouches only for the events its role emits.
		if err := emitted(busauth.Role(m.Headers().Get(seal.HeaderSigner)), subject, m.Headers(), m.Data()); err != nil {
			r.refuse(log, m, md, subject, err)
			return
		}
	}
	// The emitter's message id goes with it, its signature does not.
	h := make(nats.Header, len(m.Headers()))
	for k, v := range m.Headers() {
		if k != seal.HeaderSigner && k != seal.HeaderSignature {
			h[k] = v
		}
	}
	var opts []jetstream.PublishOpt
	if subjects.IsResult(subject) {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(0))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = r.JS.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: m.Data()}, opts...)
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence:
		// The call's result is there already: its pending answer is moot.
	default:
		log.Warn("relaying", "subject", subject, "err", err)
		_ = m.NakWithDelay(backoff(int(md.NumDelivered)))
		return
	}
	_ = m.Ack()
	r.count(outcomeForwarded)
}

// refuse records a relayed message audit will not publish and drops it.
func (r *Relay) refuse(log *slog.Logger, m jetstream.Msg, md *jetstream.MsgMetadata, subject string, cause error) {
	log.Error("refused relayed message", "subject", m.Subject(), "seq", md.Sequence.Stream, "err", cause)
	tenant, ok := subjects.TenantOfRelayed(subject)
	if !ok || subjects.CheckTenant(tenant) != nil {
		tenant = subjects.SystemTenant
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	o, err := poisonEventFor(tenant, relayStage, m.Subject(), md.Stream, md.Sequence.Stream, cause)
	if err == nil {
		err = Publish(ctx, r.JS, o)
	}
	if err != nil {
		log.Warn("recording refused relayed message", "err", err)
		_ = m.NakWithDelay(backoff(int(md.NumDelivered)))
		return
	}
	_ = m.TermWithReason("refused: " + cause.Error())
	r.count(outcomePoison)
}

func (r *Relay) count(outcome string) {
	if r.Metrics != nil {
		r.Metrics.messages.WithLabelValues(relayStage, outcome).Inc()
	}
}

// emitted returns nil when the relayed message is a structured CloudEvent
// that role emits on subject: its type, source and tenant as the role's
// Emissions allow (busauth.MayEmit). Anything else, whatever role's key
// signed, is refused with E3231: it would be published as an event of a
// type, or from a stage, that its signer never emits.
func emitted(role busauth.Role, subject string, h nats.Header, data []byte) error {
	var e struct {
		ID     string `json:"id"`
		Type   string `json:"type"`
		Source string `json:"source"`
		Tenant string `json:"tenantid"`
	}
	refuse := func(why string) error {
		return api.NewError(api.PermissionDenied, api.ERelayRefused, "refused the relayed event %q signed by %s: %s", e.ID, role, why).
			WithDetail("subject", subject)
	}
	if err := json.Unmarshal(data, &e); err != nil {
		return refuse("not a structured CloudEvent: " + err.Error())
	}
	// The body is the event: a reader must not find another one, in
	// binary mode, in ce- headers that nothing here checks.
	for k := range h {
		if len(k) >= 3 && strings.EqualFold(k[:3], "ce-") {
			return refuse(fmt.Sprintf("header %s: a relayed event is structured, its attributes in its body", k))
		}
	}
	if why := busauth.MayEmit(role, subject, e.Type, e.Source, e.Tenant); why != "" {
		return refuse(why)
	}
	return nil
}

// pendingAnswer reports whether data is a structured tool.accepted
// CloudEvent whose response is pending.
func pendingAnswer(data []byte) bool {
	var e struct {
		Type string `json:"type"`
		Data struct {
			Status api.Status `json:"status"`
		} `json:"data"`
	}
	return json.Unmarshal(data, &e) == nil && e.Type == api.TypeAccepted && e.Data.Status == api.StatusPending
}
