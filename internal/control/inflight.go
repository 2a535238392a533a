package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/subjects"
)

// inFlight reports whether invocation id of tenant is still travelling
// through toolgate without a record: handed between stages before one of
// them wrote its status. The pipeline uses work-queue retention, so it holds
// only messages not yet settled and the scan costs as much as the tenant's
// backlog. The invoke stream is not read: it holds the agents' raw
// capability tokens, which only validate and authorize see; a call validate
// has not yet claimed (milliseconds, unless validate is down) is not found.
func inFlight(ctx context.Context, js jetstream.JetStream, tenant, id string) (bool, error) {
	if !literalToken(tenant) {
		return false, nil // nothing can have been published for it
	}
	return scan(ctx, js, subjects.StreamPipeline, subjects.PipeTenant(tenant), func(m *jetstream.RawStreamMsg) bool {
		var inv struct {
			ID     string `json:"id"`
			Tenant string `json:"tenant"`
		}
		return json.Unmarshal(m.Data, &inv) == nil && inv.ID == id && inv.Tenant == tenant
	})
}

// scan calls match with each message of stream on filter until it returns
// true or the stream has no more.
func scan(ctx context.Context, js jetstream.JetStream, stream, filter string, match func(*jetstream.RawStreamMsg) bool) (bool, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return false, fmt.Errorf("opening %s: %w", stream, err)
	}
	for seq := uint64(1); ; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("reading %s: %w", stream, err)
		}
		if match(m) {
			return true, nil
		}
		seq = m.Sequence + 1
	}
}

// literalToken reports whether t is one subject token without wildcards.
func literalToken(t string) bool {
	return t != "" && !strings.ContainsAny(t, ".*> \t\r\n")
}
