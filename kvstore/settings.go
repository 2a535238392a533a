package kvstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// RecordSettings stores v under group unless the group is recorded already,
// and returns what is stored: v when this call recorded it (first start),
// else the earlier record, for the caller to compare. With replace, v
// overwrites the record (an operator's deliberate change).
func (s *Store) RecordSettings(ctx context.Context, group string, v map[string]string, replace bool) (map[string]string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if replace {
		if _, err := s.settings.Put(ctx, group, b); err != nil {
			return nil, fmt.Errorf("recording %s settings: %w", group, err)
		}
		return v, nil
	}
	if _, err := s.settings.Create(ctx, group, b); err == nil {
		return v, nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return nil, fmt.Errorf("recording %s settings: %w", group, err)
	}
	e, err := s.settings.Get(ctx, group)
	if err != nil {
		return nil, fmt.Errorf("reading %s settings: %w", group, err)
	}
	var got map[string]string
	if err := json.Unmarshal(e.Value(), &got); err != nil {
		return nil, fmt.Errorf("reading %s settings: %w", group, err)
	}
	return got, nil
}
