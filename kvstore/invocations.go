package kvstore

import (
	"context"
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
	if rec.UpdatedAt.IsZero() {
		rec.UpdatedAt = time.Now().UTC()
	}
	written := false
	got, _, err := update(ctx, s.invocations, invocationKey(rec.Tenant, rec.InvocationID), func(stored *api.Record, exists bool) error {
		written = false
		next := rec
		if exists {
			if stored.Status.Terminal() || !sameInvocation(*stored, rec) {
				return ErrUnchanged
			}
			if next.Digest == "" {
				next.Digest = stored.Digest
			}
			if next.Agent == "" {
				next.Agent = stored.Agent // the caller stays recorded
			}
			if stored.CancelRequested {
				next.CancelRequested, next.CancelSig, next.CancelBy = true, stored.CancelSig, stored.CancelBy
			}
			if next.DocumentPins == nil {
				next.DocumentPins = stored.DocumentPins // the versions the call read stay recorded
			}
		}
		*stored, written = next, true
		return nil
	})
	if err != nil {
		return api.Record{}, false, fmt.Errorf("status of %s: %w", rec.InvocationID, err)
	}
	return got, written, nil
}

// ClaimRun is SetStatus that also returns the record stored before it (ok
// false when there was none), read in the same compare-and-swap: execute
// learns whether an earlier delivery started the tool and claims the run in
// one round trip. fill, when not nil, completes rec from the earlier record
// (its checkpoint) before it is written.
func (s *Store) ClaimRun(ctx context.Context, rec api.Record, fill func(prev api.Record, next *api.Record)) (prev api.Record, ok bool, stored api.Record, written bool, err error) {
	if rec.UpdatedAt.IsZero() {
		rec.UpdatedAt = time.Now().UTC()
	}
	stored, _, err = update(ctx, s.invocations, invocationKey(rec.Tenant, rec.InvocationID), func(cur *api.Record, exists bool) error {
		prev, ok, written = *cur, exists, false
		next := rec
		if exists {
			if cur.Status.Terminal() || !sameInvocation(*cur, rec) {
				return ErrUnchanged
			}
			if next.Digest == "" {
				next.Digest = cur.Digest
			}
			if next.Agent == "" {
				next.Agent = cur.Agent
			}
			if cur.CancelRequested {
				next.CancelRequested, next.CancelSig, next.CancelBy = true, cur.CancelSig, cur.CancelBy
			}
		}
		if fill != nil {
			fill(*cur, &next)
		}
		*cur, written = next, true
		return nil
	})
	if err != nil {
		return api.Record{}, false, api.Record{}, false, fmt.Errorf("status of %s: %w", rec.InvocationID, err)
	}
	return prev, ok, stored, written, nil
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
// (a cancel that came first) is adopted, keeping its cancel flag. agent is
// the agent the request names, who may see the call (api.Record.Agent);
// tool and version the tool it asks for, as asked (the status of a call
// that waits for its site names the site from them). again reports a
// claim found already made, by this publish when the Seq is seq: a
// redelivery, or a re-drive of a call that may have been charged before.
func (s *Store) ClaimInvocation(ctx context.Context, tenant, id string, seq uint64, digest, agent, tool, version string) (rec api.Record, again bool, err error) {
	// The id is new but for a redelivery, a reused id or a cancel that came
	// first: the claim is tried as a create before anything is read.
	rec, _, err = updateFresh(ctx, s.invocations, invocationKey(tenant, id), func(stored *api.Record, exists bool) error {
		again = exists && (stored.Seq != 0 || stored.Status.Terminal())
		if again {
			return ErrUnchanged
		}
		rec := api.Record{InvocationID: id, Tenant: tenant, Agent: agent, Status: api.StatusPending, Seq: seq, Digest: digest,
			ToolID: tool, ToolVersion: version, UpdatedAt: time.Now().UTC()}
		if exists {
			rec.CancelRequested, rec.CancelSig, rec.CancelBy, rec.Status = stored.CancelRequested, stored.CancelSig, stored.CancelBy, stored.Status
		}
		*stored = rec
		return nil
	})
	if err != nil {
		return api.Record{}, false, fmt.Errorf("claiming invocation id %s: %w", id, err)
	}
	return rec, again, nil
}

// Status returns the stored record of an invocation, or ErrNotFound.
func (s *Store) Status(ctx context.Context, tenant, id string) (api.Record, error) {
	key := invocationKey(tenant, id)
	e, err := s.invocations.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return api.Record{}, ErrNotFound
	}
	if err != nil {
		return api.Record{}, err
	}
	if w, ok := rememberedEntry(s.invocations, key, e); ok && w.hasRec {
		return w.rec, nil // validate's claim, read by execute: no record to decode into
	}
	var rec api.Record
	if err := decodeEntry(s.invocations, key, e, &rec); err != nil {
		return api.Record{}, fmt.Errorf("decoding status: %w", err)
	}
	return rec, nil
}

// UpdateRecord applies change to a non-terminal record with compare-and-swap.
// It returns the stored record; a terminal record is returned unchanged, and
// a missing one is created from an empty record with tenant and id.
func (s *Store) UpdateRecord(ctx context.Context, tenant, id string, change func(*api.Record)) (api.Record, error) {
	rec, _, err := update(ctx, s.invocations, invocationKey(tenant, id), func(rec *api.Record, exists bool) error {
		if !exists {
			*rec = api.Record{InvocationID: id, Tenant: tenant, Status: api.StatusPending}
		}
		if rec.Status.Terminal() {
			return ErrUnchanged
		}
		change(rec)
		rec.UpdatedAt = time.Now().UTC()
		return nil
	})
	if err != nil {
		return api.Record{}, fmt.Errorf("updating status of %s: %w", id, err)
	}
	return rec, nil
}
