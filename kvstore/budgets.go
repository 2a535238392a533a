package kvstore

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/subjects"
)

// SessionUsage is one budget key's usage.
type SessionUsage struct {
	Tenant, Session string
	Usage           Usage
}

// Budgets lists the usage of every budget key of tenant (every tenant's
// when tenant is ""). It reads each key: it is for an operator's page, not
// for a call's path.
func (s *Store) Budgets(ctx context.Context, tenant string) ([]SessionUsage, error) {
	pattern := ">"
	if tenant != "" {
		pattern = subjects.Token(tenant) + ".*"
	}
	keys, err := s.keys(ctx, s.budgets, pattern)
	if err != nil {
		return nil, err
	}
	var out []SessionUsage
	for _, k := range keys {
		tt, st, ok := strings.Cut(k, ".")
		if !ok {
			continue
		}
		t, err1 := subjects.Untoken(tt)
		sess, err2 := subjects.Untoken(st)
		if err1 != nil || err2 != nil {
			continue
		}
		e, err := s.budgets.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // deleted since listed
		}
		if err != nil {
			return nil, err
		}
		var u Usage
		if json.Unmarshal(e.Value(), &u) != nil {
			continue
		}
		out = append(out, SessionUsage{Tenant: t, Session: sess, Usage: u})
	}
	return out, nil
}
