package kvstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// ErrNotFound reports an unknown invocation.
var ErrNotFound = api.NewError(api.InvocationNotFound, api.EInvocationNotFound, "unknown invocation")

func invocationKey(tenant, id string) string {
	return subjects.Token(tenant) + "." + subjects.Token(id)
}

// SetStatus records rec unless the invocation already has a terminal status:
// a terminal status is written once and never replaced. Nor is a record that
// belongs to another publish (another ingest sequence) of the same id. It
// returns the record that is stored afterwards and whether rec was written.
func (s *Store) SetStatus(ctx context.Context, rec api.Record) (api.Record, bool, error) {
	key := invocationKey(rec.Tenant, rec.InvocationID)
	if rec.UpdatedAt.IsZero() {
		rec.UpdatedAt = time.Now().UTC()
	}
	val, err := json.Marshal(rec)
	if err != nil {
		return api.Record{}, false, err
	}
	for range 16 {
		cur, err := s.invocations.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			_, err = s.invocations.Create(ctx, key, val)
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue // lost a race: read the winner
			}
			if err != nil {
				return api.Record{}, false, fmt.Errorf("creating status: %w", err)
			}
			return rec, true, nil
		}
		if err != nil {
			return api.Record{}, false, fmt.Errorf("reading status: %w", err)
		}
		var stored api.Record
		if err := json.Unmarshal(cur.Value(), &stored); err != nil {
			return api.Record{}, false, fmt.Errorf("decoding status: %w", err)
		}
		if stored.Status.Terminal() || !sameInvocation(stored, rec) {
			return stored, false, nil
		}
		if rec.Digest == "" {
			rec.Digest = stored.Digest
		}
		if stored.CancelRequested && !rec.CancelRequested {
			rec.CancelRequested = true
			if val, err = json.Marshal(rec); err != nil {
				return api.Record{}, false, err
			}
		}
		_, err = s.invocations.Update(ctx, key, val, cur.Revision())
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err != nil {
			return api.Record{}, false, fmt.Errorf("updating status: %w", err)
		}
		return rec, true, nil
	}
	return api.Record{}, false, fmt.Errorf("status of %s: too much contention", rec.InvocationID)
}

// sameInvocation reports whether rec may replace stored: both belong to the
// same publish, or stored was made before any publish claimed the id (a
// cancel request that arrived first).
func sameInvocation(stored, rec api.Record) bool {
	return stored.Seq == 0 || rec.Seq == 0 || stored.Seq == rec.Seq
}

// ClaimInvocation takes the id (tenant, id) for the publish with ingest
// sequence seq and request digest digest, the first time any stage sees it.
// It returns the stored record afterwards: the caller owns the id when the
// record's Seq is seq (a new claim, or a redelivery of its own); any other
// Seq is an earlier request that holds the id. A record without a sequence
// (a cancel that came first) is adopted, keeping its cancel flag.
func (s *Store) ClaimInvocation(ctx context.Context, tenant, id string, seq uint64, digest string) (api.Record, error) {
	key := invocationKey(tenant, id)
	for range casAttempts {
		rec := api.Record{InvocationID: id, Tenant: tenant, Status: api.StatusPending, Seq: seq, Digest: digest,
			UpdatedAt: time.Now().UTC()}
		e, err := s.invocations.Get(ctx, key)
		var rev uint64
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return api.Record{}, fmt.Errorf("reading status: %w", err)
		default:
			var stored api.Record
			if err := json.Unmarshal(e.Value(), &stored); err != nil {
				return api.Record{}, fmt.Errorf("decoding status: %w", err)
			}
			if stored.Seq != 0 || stored.Status.Terminal() {
				return stored, nil
			}
			rec.CancelRequested, rec.Status = stored.CancelRequested, stored.Status
			rev = e.Revision()
		}
		val, err := json.Marshal(rec)
		if err != nil {
			return api.Record{}, err
		}
		if rev == 0 {
			_, err = s.invocations.Create(ctx, key, val)
		} else {
			_, err = s.invocations.Update(ctx, key, val, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err != nil {
			return api.Record{}, fmt.Errorf("claiming invocation id: %w", err)
		}
		return rec, nil
	}
	return api.Record{}, fmt.Errorf("status of %s: too much contention", id)
}

// Status returns the stored record of an invocation, or ErrNotFound.
func (s *Store) Status(ctx context.Context, tenant, id string) (api.Record, error) {
	e, err := s.invocations.Get(ctx, invocationKey(tenant, id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return api.Record{}, ErrNotFound
	}
	if err != nil {
		return api.Record{}, err
	}
	var rec api.Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return api.Record{}, fmt.Errorf("decoding status: %w", err)
	}
	return rec, nil
}

// UpdateRecord applies change to a non-terminal record with compare-and-swap.
// It returns the stored record; a terminal record is returned unchanged, and
// a missing one is created from an empty record with tenant and id.
func (s *Store) UpdateRecord(ctx context.Context, tenant, id string, change func(*api.Record)) (api.Record, error) {
	key := invocationKey(tenant, id)
	for range casAttempts {
		rec := api.Record{InvocationID: id, Tenant: tenant, Status: api.StatusPending}
		var rev uint64
		e, err := s.invocations.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return api.Record{}, err
		default:
			if err := json.Unmarshal(e.Value(), &rec); err != nil {
				return api.Record{}, fmt.Errorf("decoding status: %w", err)
			}
			rev = e.Revision()
		}
		if rec.Status.Terminal() {
			return rec, nil
		}
		change(&rec)
		rec.UpdatedAt = time.Now().UTC()
		val, err := json.Marshal(rec)
		if err != nil {
			return api.Record{}, err
		}
		if rev == 0 {
			_, err = s.invocations.Create(ctx, key, val)
		} else {
			_, err = s.invocations.Update(ctx, key, val, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err != nil {
			return api.Record{}, fmt.Errorf("updating status: %w", err)
		}
		return rec, nil
	}
	return api.Record{}, fmt.Errorf("status of %s: too much contention", id)
}
