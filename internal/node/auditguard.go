package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/backoff"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// AuditRecreated is the data of an audit.recreated event.
type AuditRecreated struct {
	Stream string `json:"stream"`
	// Why it was looked at: "deleted" (the stream-deleted advisory) or
	// "missing" (the periodic check).
	Noticed string `json:"noticed"`
}

// GuardAudit keeps the audit trail's stream in place until ctx ends: when
// JetStream announces AUDIT deleted, and every interval, it creates the
// stream again if it is missing and records that it did. Only the operator
// role may delete AUDIT; this covers an operator's mistake. The pipeline
// does not wait for it: the audit stage's publishes fail and are retried
// until the stream is back.
func (n *Node) GuardAudit(ctx context.Context, interval time.Duration) error {
	kick := make(chan string, 1)
	sub, err := n.NC.Subscribe(subjects.StreamDeletedAdvisory(subjects.StreamAudit), func(*nats.Msg) {
		select {
		case kick <- "deleted":
		default:
		}
	})
	if err != nil {
		return fmt.Errorf("watching the audit stream: %w", err)
	}
	go func() {
		defer func() { _ = sub.Unsubscribe() }()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			noticed := "missing"
			select {
			case <-ctx.Done():
				return
			case noticed = <-kick:
			case <-t.C:
			}
			if err := n.ensureAudit(ctx, noticed, kick); err != nil && ctx.Err() == nil {
				// A cluster may still be removing the deleted stream: try
				// again soon rather than at the next tick.
				n.Log.Warn("keeping the audit stream; retrying", "err", err)
				time.AfterFunc(250*time.Millisecond, func() {
					select {
					case kick <- noticed:
					default:
					}
				})
			}
		}
	}()
	return nil
}

// ensureAudit makes AUDIT again if it is missing, recording what noticed
// it: the deletion's advisory, when one comes on kick meanwhile.
func (n *Node) ensureAudit(ctx context.Context, noticed string, kick <-chan string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := n.JS.Stream(ctx, subjects.StreamAudit); !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	// The server removes a deleted stream's files after it announces the
	// deletion: a stream made again at once can have its new files
	// removed under it. Found missing by the advisory or by the ticker
	// (which may come first), it is made again a second later.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Second):
	}
	select {
	case noticed = <-kick:
	default:
	}
	var cfg jetstream.StreamConfig
	for _, c := range topology.Streams(n.Topology) {
		if c.Name == subjects.StreamAudit {
			cfg = c
		}
	}
	if _, err := n.JS.CreateStream(ctx, cfg); err != nil {
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			if _, err := n.JS.Stream(ctx, subjects.StreamAudit); err == nil {
				return nil // another process was first, and records it
			}
		}
		return fmt.Errorf("creating %s again: %w", subjects.StreamAudit, err)
	}
	n.Log.Warn("the audit stream was missing and is created again", "noticed", noticed)
	now := time.Now().UTC()
	e := event.New()
	e.SetID(fmt.Sprintf("audit-recreated-%d", now.UnixNano()))
	e.SetSource("urn:toolgate:node")
	e.SetType(api.TypeAuditRecreated)
	e.SetTime(now)
	if err := e.SetData(event.ApplicationJSON, AuditRecreated{Stream: subjects.StreamAudit, Noticed: noticed}); err != nil {
		return err
	}
	o, err := stages.EventOutput(subjects.AuditEvent(subjects.SystemTenant, envelope.SubjectSuffix(api.TypeAuditRecreated)), &e)
	if err != nil {
		return err
	}
	// The stream was just created and may not take writes yet (a cluster
	// still placing it): retry the record until it is stored, since the
	// next check finds the stream in place and would never record it.
	m := &nats.Msg{Subject: o.Subject, Header: o.Header, Data: o.Data}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer rcancel()
	js := n.JS
	if n.AuditRecorder != nil {
		js = n.AuditRecorder
	}
	for attempt := 1; ; attempt++ {
		_, err = js.PublishMsg(rctx, m, jetstream.WithMsgID(o.MsgID))
		if err == nil {
			return nil
		}
		n.Log.Warn("recording the audit stream's recreation; retrying", "attempt", attempt, "err", err)
		select {
		case <-rctx.Done():
			return fmt.Errorf("recording the recreation of %s: %w", subjects.StreamAudit, err)
		case <-time.After(backoff.Exponential(attempt, 100*time.Millisecond, 2*time.Second)):
		}
	}
}
