package kvstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// BucketCapabilities holds capability requests with their answers, for the
// run report, by tenant and request id.
const BucketCapabilities = subjects.BucketCapabilities

// SaveCapability stores a capability request's record; a request id is
// written once (E3041 for a second request with the same id).
func (s *Store) SaveCapability(ctx context.Context, r api.CapabilityReport) error {
	val, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = s.capability.Create(ctx, invocationKey(r.Tenant, r.RequestID), val)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return api.NewError(api.InvalidParameters, api.ECapabilityDuplicate,
			"capability request %s of tenant %s exists already", r.RequestID, r.Tenant)
	}
	if err != nil {
		return fmt.Errorf("recording capability request: %w", err)
	}
	return nil
}

// Capability returns a capability request's record, or E3042 when there is
// none.
func (s *Store) Capability(ctx context.Context, tenant, id string) (api.CapabilityReport, error) {
	e, err := s.capability.Get(ctx, invocationKey(tenant, id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return api.CapabilityReport{}, api.NewError(api.InvalidParameters, api.ECapabilityUnknown,
			"no capability request %s in tenant %s", id, tenant)
	}
	if err != nil {
		return api.CapabilityReport{}, err
	}
	var r api.CapabilityReport
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return api.CapabilityReport{}, fmt.Errorf("decoding capability request: %w", err)
	}
	return r, nil
}
