package client

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// RecordedDecisions reads the decision inputs authorize recorded since
// (zero: all stored), oldest first: the policy.decision.recorded audit
// events of every tenant (serve --record-decisions). It reads the AUDIT
// stream with an ordered consumer, which operator credentials may create.
func (c *Client) RecordedDecisions(ctx context.Context, since time.Time) ([]api.DecisionRecord, error) {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{subjects.DecisionRecordedAll}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if !since.IsZero() {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	cons, err := c.js.OrderedConsumer(ctx, subjects.StreamAudit, cfg)
	if err != nil {
		return nil, refusedOr(ctx, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []api.DecisionRecord
	for left := info.NumPending; left > 0; left-- {
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if errors.Is(err, jetstream.ErrNoMessages) || errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			return out, err
		}
		var ev struct {
			Time time.Time          `json:"time"`
			Data api.DecisionRecord `json:"data"`
		}
		if json.Unmarshal(m.Data(), &ev) != nil {
			continue // not one authorize wrote
		}
		ev.Data.RecordedAt = ev.Time
		out = append(out, ev.Data)
	}
	return out, nil
}
