// Package auditexport copies the AUDIT stream to JSON Lines, so events can be
// archived before the stream's age limit (90 days by default) removes them.
package auditexport

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/subjects"
)

// Options select what Export copies.
type Options struct {
	// Since is the earliest store time copied; zero copies from the start.
	Since time.Time
	// Until, if set, is the first store time not copied.
	Until time.Time
	// Tenant limits the copy to one tenant's events; empty copies all.
	Tenant string
}

// Export writes every audit event stored since o.Since, oldest first, as one
// line of JSON (the CloudEvent in structured form) to w, and returns how many
// it wrote. It reads a snapshot: events stored after it started are left for
// the next export, so it always ends. It never deletes anything (AUDIT
// denies deletes); rerunning it with the same Since writes the same lines.
func Export(ctx context.Context, js jetstream.JetStream, w io.Writer, o Options) (int, error) {
	st, err := js.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		return 0, fmt.Errorf("audit stream: %w", err)
	}
	last := st.CachedInfo().State.LastSeq
	filter := subjects.AuditAll
	if o.Tenant != "" {
		filter = subjects.AuditTenant(o.Tenant)
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if !o.Since.IsZero() {
		since := o.Since
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	c, err := js.OrderedConsumer(ctx, subjects.StreamAudit, cfg)
	if err != nil {
		return 0, fmt.Errorf("reading audit: %w", err)
	}
	bw := bufio.NewWriter(w)
	n := 0
	var line bytes.Buffer
	for {
		batch, err := c.Fetch(500, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return n, fmt.Errorf("reading audit: %w", err)
		}
		got, done := 0, false
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return n, err
			}
			if md.Sequence.Stream > last || (!o.Until.IsZero() && !md.Timestamp.Before(o.Until)) {
				done = true
				continue
			}
			line.Reset()
			if err := json.Compact(&line, m.Data()); err != nil {
				return n, fmt.Errorf("audit event %d is not JSON: %w", md.Sequence.Stream, err)
			}
			line.WriteByte('\n')
			if _, err := bw.Write(line.Bytes()); err != nil {
				return n, err
			}
			n++
			if md.NumPending == 0 || md.Sequence.Stream == last {
				done = true
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return n, fmt.Errorf("reading audit: %w", err)
		}
		if done || got == 0 || ctx.Err() != nil {
			break
		}
	}
	if err := bw.Flush(); err != nil {
		return n, err
	}
	return n, ctx.Err()
}
