package kvstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/modelrouter"
	"github.com/toolgate/toolgate/subjects"
)

// --- model catalogue ---------------------------------------------------------

// PutModel checks a catalogue entry and stores it under its name,
// replacing an earlier one; it returns the entry as stored (defaults
// filled).
func (s *Store) PutModel(ctx context.Context, data []byte) (modelrouter.Model, error) {
	return s.PutSignedModel(ctx, data, "", nil)
}

// ModelRecord is a stored catalogue entry (Model) or routing policy (Rego,
// under modelrouter.RoutingKey; empty is the shipped policy) with the
// operator's signed request that made it. Readers on an authenticated bus
// honour none without one (internal/signedstate). A bare model document
// or Rego text is read as an unsigned record.
type ModelRecord struct {
	Model json.RawMessage    `json:"model,omitempty"`
	Rego  *string            `json:"rego,omitempty"`
	By    string             `json:"by,omitempty"`
	Proof *api.DecisionProof `json:"proof,omitempty"`
}

// decodeModelRecord reads a stored value of key.
func decodeModelRecord(key string, val []byte) ModelRecord {
	var r ModelRecord
	err := json.Unmarshal(val, &r)
	if key == modelrouter.RoutingKey {
		if err == nil && r.Rego != nil {
			return r
		}
		src := string(val)
		return ModelRecord{Rego: &src}
	}
	if err == nil && len(r.Model) > 0 {
		return r
	}
	return ModelRecord{Model: val}
}

// CheckModel judges a stored model or routing policy record before a
// reader honours it, as CheckTool does tools. A routing policy's delete is
// judged too, as an empty unsigned record: a signed reset is a record.
type CheckModel func(rec ModelRecord, key string, revision uint64) error

// PutSignedModel is PutModel keeping the signed request proof (made by
// the operator by) in the stored record.
func (s *Store) PutSignedModel(ctx context.Context, data []byte, by string, proof *api.DecisionProof) (modelrouter.Model, error) {
	m, err := modelrouter.Decode(data)
	if err != nil {
		return modelrouter.Model{}, err
	}
	val, err := json.Marshal(m)
	if err != nil {
		return modelrouter.Model{}, err
	}
	if proof != nil {
		if val, err = json.Marshal(ModelRecord{Model: val, By: by, Proof: proof}); err != nil {
			return modelrouter.Model{}, err
		}
	}
	if _, err := s.models.Put(ctx, subjects.Token(m.Name), val); err != nil {
		return modelrouter.Model{}, fmt.Errorf("storing model %s: %w", m.Name, err)
	}
	return m, nil
}

// ErrModelNotFound is an unknown model.
var ErrModelNotFound = errors.New("unknown model")

// DeleteModel removes a model.
func (s *Store) DeleteModel(ctx context.Context, name string) error {
	key := subjects.Token(name)
	if _, err := s.models.Get(ctx, key); errors.Is(err, jetstream.ErrKeyNotFound) {
		return ErrModelNotFound
	}
	return s.models.Delete(ctx, key)
}

// Models lists the stored models; entries that no longer decode are
// skipped.
func (s *Store) Models(ctx context.Context) ([]modelrouter.Model, error) {
	keys, err := s.keys(ctx, s.models, ">")
	if err != nil {
		return nil, err
	}
	var out []modelrouter.Model
	for _, k := range keys {
		if k == modelrouter.RoutingKey {
			continue
		}
		e, err := s.models.Get(ctx, k)
		if err != nil {
			continue
		}
		rec := decodeModelRecord(k, e.Value())
		if s.checkModel != nil && s.checkModel(rec, k, e.Revision()) != nil {
			continue
		}
		if m, err := modelrouter.Decode(rec.Model); err == nil {
			out = append(out, m)
		}
	}
	return out, nil
}

// WatchModels keeps c in step with the bucket: it returns once the stored
// models are loaded and applies changes until ctx ends.
func (s *Store) WatchModels(ctx context.Context, c *modelrouter.Catalogue) error {
	if r, _ := c.Ranker(); r == nil {
		if err := c.SetRouting(ctx, ""); err != nil {
			return err
		}
	}
	return s.watch(ctx, s.models, func(e jetstream.KeyValueEntry) {
		if e.Key() == modelrouter.RoutingKey {
			rec := ModelRecord{Rego: new(string)}
			if e.Operation() == jetstream.KeyValuePut {
				rec = decodeModelRecord(e.Key(), e.Value())
			} else if s.checkModel != nil {
				rec = ModelRecord{} // a reset is a signed record, never a delete
			}
			if s.checkModel != nil && s.checkModel(rec, e.Key(), e.Revision()) != nil {
				return
			}
			_ = c.SetRouting(ctx, *rec.Rego) // refused at put; the one in use is kept
			return
		}
		if e.Operation() != jetstream.KeyValuePut {
			if name, err := subjects.Untoken(e.Key()); err == nil {
				c.Delete(name)
			}
			return
		}
		rec := decodeModelRecord(e.Key(), e.Value())
		if s.checkModel != nil && s.checkModel(rec, e.Key(), e.Revision()) != nil {
			return
		}
		if m, err := modelrouter.Decode(rec.Model); err == nil {
			c.Put(m)
		}
	})
}

// PutRoutingPolicy compiles a routing policy (Rego, see
// modelrouter.RoutingQuery) and stores it for every worker; empty src
// restores the shipped policy.
func (s *Store) PutRoutingPolicy(ctx context.Context, src []byte) error {
	return s.PutSignedRoutingPolicy(ctx, src, "", nil)
}

// PutSignedRoutingPolicy is PutRoutingPolicy keeping the signed request
// proof (made by the operator by) in the stored record; a signed reset
// is stored as a record of the empty policy, not a delete, so readers can
// tell it from a delete nobody signed.
func (s *Store) PutSignedRoutingPolicy(ctx context.Context, src []byte, by string, proof *api.DecisionProof) error {
	if proof != nil {
		if len(src) > 0 {
			if _, err := modelrouter.NewRegoRanker(ctx, string(src)); err != nil {
				return err
			}
		}
		rego := string(src)
		val, err := json.Marshal(ModelRecord{Rego: &rego, By: by, Proof: proof})
		if err != nil {
			return err
		}
		_, err = s.models.Put(ctx, modelrouter.RoutingKey, val)
		return err
	}
	if len(src) == 0 {
		err := s.models.Delete(ctx, modelrouter.RoutingKey)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		return err
	}
	if _, err := modelrouter.NewRegoRanker(ctx, string(src)); err != nil {
		return err
	}
	_, err := s.models.Put(ctx, modelrouter.RoutingKey, src)
	return err
}
