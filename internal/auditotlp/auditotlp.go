// Package auditotlp sends the audit trail to a SIEM as OpenTelemetry log
// records over OTLP/HTTP (docs/audit.md). It reads AUDIT through a durable
// consumer of its own and acknowledges an event only once the collector
// took its batch, so an endpoint that is down loses nothing: AUDIT keeps
// the events and the export resumes where it stopped.
package auditotlp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/backoff"
	"github.com/toolgate/toolgate/subjects"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	otellog "go.opentelemetry.io/otel/log"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/sdk/resource"
	"go.opentelemetry.io/otel/trace"
)

// Attribute keys of a record, besides its body (the event as stored).
const (
	AttrTenant  = "toolgate.tenant"
	AttrType    = "cloudevents.event_type"
	AttrID      = "cloudevents.event_id"
	AttrTool    = "toolgate.tool_id"
	AttrOutcome = "toolgate.outcome"
	AttrCode    = "toolgate.error_code"
	AttrSeq     = "toolgate.audit_seq"
)

// Exporter sends AUDIT's events to an OTLP/HTTP collector.
type Exporter struct {
	JS jetstream.JetStream
	// Endpoint is a URL (http://collector:4318; /v1/logs is added when
	// it has no path) or host:port (plain HTTP).
	Endpoint string
	Log      *slog.Logger
	// Batch is the events a request carries at most (default 200).
	Batch int
	// Exported and Failed are told of each batch sent and each that was
	// not (metrics); either may be nil.
	Exported func(n int)
	Failed   func(err error)
}

// Options are the exporter's options for endpoint.
func Options(endpoint string) ([]otlploghttp.Option, error) {
	if !strings.Contains(endpoint, "://") {
		return []otlploghttp.Option{otlploghttp.WithEndpoint(endpoint), otlploghttp.WithInsecure()}, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("audit OTLP endpoint: %w", err)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/logs"
	}
	return []otlploghttp.Option{otlploghttp.WithEndpointURL(u.String())}, nil
}

// Run exports until ctx ends.
func (x *Exporter) Run(ctx context.Context) error {
	opts, err := Options(x.Endpoint)
	if err != nil {
		return err
	}
	// The exporter's own retries would hold a batch for minutes; Run
	// retries instead, with the events still unacknowledged in AUDIT.
	opts = append(opts, otlploghttp.WithRetry(otlploghttp.RetryConfig{Enabled: false}), otlploghttp.WithTimeout(10*time.Second))
	exp, err := otlploghttp.New(ctx, opts...)
	if err != nil {
		return fmt.Errorf("audit OTLP exporter: %w", err)
	}
	defer func() { _ = exp.Shutdown(context.WithoutCancel(ctx)) }()
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", "toolgate")), resource.WithFromEnv())
	if err != nil {
		return err
	}
	col := &collect{}
	lp := sdklog.NewLoggerProvider(sdklog.WithProcessor(col), sdklog.WithResource(res),
		sdklog.WithAttributeValueLengthLimit(-1))
	logger := lp.Logger("github.com/toolgate/toolgate/audit")
	in := subjects.AuditOTLPInput
	var cons jetstream.Consumer
	for attempt := 1; ; attempt++ {
		if cons, err = x.JS.Consumer(ctx, in.Stream, in.Consumer); err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		x.Log.Warn("the audit OTLP consumer is not there yet; retrying", "err", err)
		if !sleep(ctx, backoff.FullJitter(attempt, time.Second, 30*time.Second)) {
			return nil
		}
	}
	size := x.Batch
	if size <= 0 {
		size = 200
	}
	failures := 0
	for ctx.Err() == nil {
		batch, err := cons.Fetch(size, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			if ctx.Err() == nil {
				x.Log.Warn("reading AUDIT for OTLP", "err", err)
				sleep(ctx, time.Second)
			}
			continue
		}
		var msgs []jetstream.Msg
		for m := range batch.Messages() {
			msgs = append(msgs, m)
			logger.Emit(recordContext(ctx, m), record(m))
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && ctx.Err() == nil {
			x.Log.Debug("reading AUDIT for OTLP", "err", err)
		}
		if len(msgs) == 0 {
			continue
		}
		recs := col.take()
		if err := exp.Export(ctx, recs); err != nil {
			failures++
			if x.Failed != nil {
				x.Failed(err)
			}
			wait := backoff.FullJitter(failures, time.Second, time.Minute)
			x.Log.Warn("audit events not exported over OTLP; retrying", "events", len(msgs), "err", err, "retry_in", wait)
			for _, m := range msgs {
				_ = m.NakWithDelay(wait)
			}
			sleep(ctx, wait)
			continue
		}
		failures = 0
		for _, m := range msgs {
			if err := m.Ack(); err != nil {
				x.Log.Debug("acknowledging an exported audit event", "err", err)
			}
		}
		if x.Exported != nil {
			x.Exported(len(msgs))
		}
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// collect keeps the records the logger emits, for Run to export itself
// and so know whether the collector took them.
type collect struct {
	mu   sync.Mutex
	recs []sdklog.Record
}

func (c *collect) OnEmit(_ context.Context, r *sdklog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recs = append(c.recs, r.Clone())
	return nil
}

func (c *collect) take() []sdklog.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.recs
	c.recs = nil
	return out
}

func (*collect) Enabled(context.Context, sdklog.EnabledParameters) bool { return true }
func (*collect) Shutdown(context.Context) error                         { return nil }
func (*collect) ForceFlush(context.Context) error                       { return nil }

// event is what a record takes from an audit event: its CloudEvent
// attributes and the fields of its data a SIEM filters by.
type event struct {
	ID          string `json:"id"`
	Type        string `json:"type"`
	Time        string `json:"time"`
	TenantID    string `json:"tenantid"`
	TraceParent string `json:"traceparent"`
	Data        struct {
		TenantID string          `json:"tenant_id"`
		ToolID   string          `json:"tool_id"`
		Status   string          `json:"status"`
		Error    json.RawMessage `json:"error"`
	} `json:"data"`
}

// recordContext carries the event's trace context (its W3C traceparent),
// so the record names the trace the call ran in.
func recordContext(ctx context.Context, m jetstream.Msg) context.Context {
	var e event
	_ = json.Unmarshal(m.Data(), &e)
	if sc, ok := spanContext(e.TraceParent); ok {
		return trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	return ctx
}

// spanContext parses a W3C traceparent (version 00).
func spanContext(tp string) (trace.SpanContext, bool) {
	parts := strings.Split(tp, "-")
	if len(parts) != 4 || parts[0] != "00" {
		return trace.SpanContext{}, false
	}
	tid, err1 := trace.TraceIDFromHex(parts[1])
	sid, err2 := trace.SpanIDFromHex(parts[2])
	if err1 != nil || err2 != nil {
		return trace.SpanContext{}, false
	}
	var flags trace.TraceFlags
	if parts[3] == "01" {
		flags = trace.FlagsSampled
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: flags, Remote: true})
	return sc, sc.IsValid()
}

// record is the log record of one audit event: the event as stored (the
// same redacted bytes AUDIT holds) as its body.
func record(m jetstream.Msg) otellog.Record {
	var e event
	_ = json.Unmarshal(m.Data(), &e)
	var r otellog.Record
	r.SetBody(attribute.StringValue(string(m.Data())))
	r.SetEventName(e.Type)
	r.SetSeverity(otellog.SeverityInfo)
	if t, err := time.Parse(time.RFC3339Nano, e.Time); err == nil {
		r.SetTimestamp(t)
	}
	if md, err := m.Metadata(); err == nil {
		r.SetObservedTimestamp(md.Timestamp)
		r.AddAttributes(attribute.Int64(AttrSeq, int64(md.Sequence.Stream)))
	}
	tenant, _ := subjects.TenantOfAudit(m.Subject())
	r.AddAttributes(attribute.String(AttrTenant, tenant), attribute.String(AttrType, e.Type), attribute.String(AttrID, e.ID))
	if e.Data.ToolID != "" {
		r.AddAttributes(attribute.String(AttrTool, e.Data.ToolID))
	}
	if e.Data.Status != "" {
		r.AddAttributes(attribute.String(AttrOutcome, e.Data.Status))
		if e.Data.Status != "success" {
			r.SetSeverity(otellog.SeverityWarn)
		}
	}
	var code struct {
		Code string `json:"code"`
	}
	if len(e.Data.Error) > 0 && json.Unmarshal(e.Data.Error, &code) == nil && code.Code != "" {
		r.AddAttributes(attribute.String(AttrCode, code.Code))
	}
	return r
}
