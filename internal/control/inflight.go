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
// backlog. The invoke stream's messages are not read: they hold the agents'
// raw capability tokens, which only validate and authorize see. A call
// there that validate has not claimed yet counts as in flight when the
// tenant has any call waiting on the invoke stream (its message count).
func inFlight(ctx context.Context, js jetstream.JetStream, tenant, id string) (bool, error) {
	if !literalToken(tenant) {
		return false, nil // nothing can have been published for it
	}
	waiting, err := invokeBacklog(ctx, js, tenant)
	if waiting || err != nil {
		return waiting, err
	}
	return scan(ctx, js, subjects.StreamPipeline, subjects.PipeTenant(tenant), func(m *jetstream.RawStreamMsg) bool {
		var inv struct {
			ID     string `json:"id"`
			Tenant string `json:"tenant"`
		}
		return json.Unmarshal(m.Data, &inv) == nil && inv.ID == id && inv.Tenant == tenant
	})
}

// invokeBacklog reports whether tenant has calls on the invoke stream
// that validate has not settled, from the stream's subject counts.
func invokeBacklog(ctx context.Context, js jetstream.JetStream, tenant string) (bool, error) {
	s, err := js.Stream(ctx, subjects.StreamInvoke)
	if err != nil {
		return false, fmt.Errorf("opening %s: %w", subjects.StreamInvoke, err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subjects.Invoke(tenant)))
	if err != nil {
		return false, fmt.Errorf("reading %s: %w", subjects.StreamInvoke, err)
	}
	return info.State.Subjects[subjects.Invoke(tenant)] > 0, nil
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
