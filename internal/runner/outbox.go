package runner

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/subjects"
)

// Outboxing returns js with every publish a site's worker hands on or
// relays (subjects.Outboxed) sent to the site's outbox instead
// (subjects.SiteOut), which the hub bounds per site and forwards. Signing
// goes over it, so a signature covers the subject the hub forwards the
// message to, not the outbox's.
func Outboxing(js jetstream.JetStream, site string) jetstream.JetStream {
	return &outboxJS{JetStream: js, site: site}
}

type outboxJS struct {
	jetstream.JetStream
	site string
}

func (j *outboxJS) out(m *nats.Msg) *nats.Msg {
	if !subjects.Outboxed(m.Subject) {
		return m
	}
	return &nats.Msg{Subject: subjects.SiteOut(j.site, m.Subject), Reply: m.Reply, Header: m.Header, Data: m.Data}
}

func (j *outboxJS) Publish(ctx context.Context, subject string, data []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return j.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data}, opts...)
}

func (j *outboxJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return j.JetStream.PublishMsg(ctx, j.out(m), opts...)
}

func (j *outboxJS) PublishAsync(subject string, data []byte, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	return j.PublishMsgAsync(&nats.Msg{Subject: subject, Data: data}, opts...)
}

func (j *outboxJS) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	return j.JetStream.PublishMsgAsync(j.out(m), opts...)
}

// PublishOwnedAsync is PublishMsgAsync for a message the caller made for
// this publish alone (seal.OwnedPublisher): redirected in place.
func (j *outboxJS) PublishOwnedAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if subjects.Outboxed(m.Subject) {
		m.Subject = subjects.SiteOut(j.site, m.Subject)
	}
	return seal.PublishOwnedAsync(j.JetStream, m, opts...)
}
