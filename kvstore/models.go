package kvstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/modelrouter"
	"github.com/toolgate/toolgate/subjects"
)

// --- model catalogue ---------------------------------------------------------

// PutModel checks a catalogue entry and stores it under its name,
// replacing an earlier one; it returns the entry as stored (defaults
// filled).
func (s *Store) PutModel(ctx context.Context, data []byte) (modelrouter.Model, error) {
	m, err := modelrouter.Decode(data)
	if err != nil {
		return modelrouter.Model{}, err
	}
	val, err := json.Marshal(m)
	if err != nil {
		return modelrouter.Model{}, err
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
		if m, err := modelrouter.Decode(e.Value()); err == nil {
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
			src := ""
			if e.Operation() == jetstream.KeyValuePut {
				src = string(e.Value())
			}
			_ = c.SetRouting(ctx, src) // refused at put; the one in use is kept
			return
		}
		if e.Operation() != jetstream.KeyValuePut {
			if name, err := subjects.Untoken(e.Key()); err == nil {
				c.Delete(name)
			}
			return
		}
		if m, err := modelrouter.Decode(e.Value()); err == nil {
			c.Put(m)
		}
	})
}

// PutRoutingPolicy compiles a routing policy (Rego, see
// modelrouter.RoutingQuery) and stores it for every worker; empty src
// restores the shipped policy.
func (s *Store) PutRoutingPolicy(ctx context.Context, src []byte) error {
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
