package node

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/archivestore"
	"github.com/toolgate/toolgate/internal/auditarchive"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// AuditArchiveMetrics counts what the audit archive did (docs/audit.md).
type AuditArchiveMetrics struct {
	objects  prometheus.Counter
	failures prometheus.Counter
	last     prometheus.Gauge
}

// NewAuditArchiveMetrics registers the series on reg.
func NewAuditArchiveMetrics(reg prometheus.Registerer) *AuditArchiveMetrics {
	m := &AuditArchiveMetrics{
		objects: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "toolgate", Subsystem: "audit_archive", Name: "objects_total",
			Help: "Ranges of AUDIT this process archived (each read back and checked)."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "toolgate", Subsystem: "audit_archive", Name: "failures_total",
			Help: "Archive runs that failed (the store unreachable, or an object read back different); each is retried with backoff."}),
		last: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "toolgate", Subsystem: "audit_archive", Name: "last_sequence",
			Help: "The last AUDIT sequence this process archived."}),
	}
	reg.MustRegister(m.objects, m.failures, m.last)
	return m
}

// AuditArchiveFailed is the data of an audit.archive.failed event.
type AuditArchiveFailed struct {
	Code    string `json:"code"`
	Archive string `json:"archive"`
	Attempt int    `json:"attempt"`
	Error   string `json:"error"`
}

// startArchive runs the archiver beside the checkpointer, as audit.
func (n *Node) startArchive(ctx context.Context, c StageConfig) error {
	if c.AuditArchiveEvery <= 0 {
		return nil
	}
	store, err := archivestore.Open(n.JS, c.AuditArchive)
	if err != nil {
		return fmt.Errorf("audit archive: %w", err)
	}
	m := c.AuditArchiveMetrics
	a := &auditarchive.Archiver{JS: n.JS, Store: store, Key: c.AuditChainKey.Public().(ed25519.PublicKey), Log: n.Log,
		Archived: func(_ context.Context, r auditarchive.Range, _ int) {
			if m != nil {
				m.objects.Inc()
				m.last.Set(float64(r.Last))
			}
		},
		Failed: func(ctx context.Context, attempt int, err error) {
			if m != nil {
				m.failures.Inc()
			}
			n.recordArchiveFailed(ctx, AuditArchiveFailed{Code: api.EAuditArchiveFailed, Archive: store.String(), Attempt: attempt, Error: err.Error()})
		}}
	cctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); a.Run(cctx, c.AuditArchiveEvery) }()
	n.onStop(func() { stop(); <-done })
	return nil
}

// recordArchiveFailed publishes the audit event of a failed archive run.
func (n *Node) recordArchiveFailed(ctx context.Context, d AuditArchiveFailed) {
	now := time.Now().UTC()
	e := event.New()
	e.SetID(fmt.Sprintf("audit-archive-failed-%d", now.UnixNano()))
	e.SetSource("urn:toolgate:audit")
	e.SetType(api.TypeAuditArchiveFailed)
	e.SetTime(now)
	if err := e.SetData(event.ApplicationJSON, d); err != nil {
		return
	}
	o, err := stages.EventOutput(subjects.AuditEvent(subjects.SystemTenant, envelope.SubjectSuffix(api.TypeAuditArchiveFailed)), &e)
	if err != nil {
		n.Log.Warn("audit archive failure not recorded", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m := &nats.Msg{Subject: o.Subject, Header: o.Header, Data: o.Data}
	if _, err := n.JS.PublishMsg(ctx, m, jetstream.WithMsgID(o.MsgID)); err != nil {
		n.Log.Warn("audit archive failure not recorded", "err", err)
	}
}
