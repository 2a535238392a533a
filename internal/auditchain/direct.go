package auditchain

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/subjects"
)

// readDirect calls fn with each message of stream at first..last, in
// order, read with batched direct gets: one request per batch, where a
// get per message would cost a round trip per audit event. Sequences that
// hold no message are skipped (fn is not called for them).
func readDirect(ctx context.Context, nc *nats.Conn, stream string, first, last uint64, fn func(Event) error) error {
	next := first
	for next <= last {
		n, err := directBatch(ctx, nc, stream, next, last, fn)
		if err != nil {
			return err
		}
		if n == 0 {
			return nil // nothing stored from next on
		}
		next = n + 1
	}
	return nil
}

// directBatch reads one batch from seq, up to last; it returns the last
// sequence it saw (0: none).
func directBatch(ctx context.Context, nc *nats.Conn, stream string, seq, last uint64, fn func(Event) error) (uint64, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return 0, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	batch := min(last-seq+1, MaxEvents)
	req, _ := json.Marshal(map[string]any{"seq": seq, "batch": batch, "up_to_seq": last})
	if err := nc.PublishRequest(subjects.DirectGet(stream), inbox, req); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var seen uint64
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return seen, fmt.Errorf("direct get from %s at %d: %w", stream, seq, err)
		}
		if len(m.Data) == 0 && m.Header != nil && m.Header.Get("Status") != "" {
			switch m.Header.Get("Status") {
			case "204", "404": // end of batch; nothing (more) stored
				return seen, nil
			default:
				return seen, fmt.Errorf("direct get from %s at %d: %s %s", stream, seq, m.Header.Get("Status"), m.Header.Get("Description"))
			}
		}
		s, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
		if err != nil {
			return seen, fmt.Errorf("direct get from %s: no sequence", stream)
		}
		if s > last {
			continue
		}
		seen = s
		t, _ := time.Parse(time.RFC3339Nano, m.Header.Get("Nats-Time-Stamp"))
		if err := fn(Event{Seq: s, Subject: m.Header.Get("Nats-Subject"), Data: m.Data, Time: t, Header: m.Header}); err != nil {
			return seen, err
		}
	}
}

// storedAt asks stream's leader whether seq holds a message. A direct get
// may be answered by a replica that lags; a sequence it did not return is
// recorded as absent only once the leader says so.
func storedAt(ctx context.Context, nc *nats.Conn, stream string, seq uint64) (bool, error) {
	req, _ := json.Marshal(map[string]uint64{"seq": seq})
	m, err := nc.RequestWithContext(ctx, subjects.MsgGet(stream), req)
	if err != nil {
		return false, fmt.Errorf("get %d from %s: %w", seq, stream, err)
	}
	var resp struct {
		Message *struct {
			Seq uint64 `json:"seq"`
		} `json:"message"`
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return false, fmt.Errorf("get %d from %s: %w", seq, stream, err)
	}
	switch {
	case resp.Message != nil:
		return true, nil
	case resp.Error != nil && resp.Error.Code == 404:
		return false, nil
	case resp.Error != nil:
		return false, fmt.Errorf("get %d from %s: %s", seq, stream, resp.Error.Description)
	}
	return false, fmt.Errorf("get %d from %s: empty answer", seq, stream)
}

// consumerWait bounds the creation of an ordered consumer before a read
// falls back to direct gets: the bus does not answer a request the
// credentials may not publish.
const consumerWait = 3 * time.Second

// directFirstAt is the first sequence of stream stored at or after t (0:
// none), by a direct get by start time.
func directFirstAt(ctx context.Context, nc *nats.Conn, stream string, t time.Time) (uint64, error) {
	req, _ := json.Marshal(map[string]any{"start_time": t.UTC()})
	m, err := nc.RequestWithContext(ctx, subjects.DirectGet(stream), req)
	if err != nil {
		return 0, fmt.Errorf("direct get from %s at %s: %w", stream, t.Format(time.RFC3339), err)
	}
	if len(m.Data) == 0 && m.Header.Get("Status") != "" {
		if st := m.Header.Get("Status"); st == "404" || st == "204" {
			return 0, nil
		}
		return 0, fmt.Errorf("direct get from %s: %s %s", stream, m.Header.Get("Status"), m.Header.Get("Description"))
	}
	return strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
}
