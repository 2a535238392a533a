package kind

import (
	"context"
	"sync"

	"github.com/toolgate/toolgate/api"
)

// Meter is where a tool records what it consumed beyond its runtime: the
// tokens and cost of a model call. The execute stage puts one in the tool's
// context and copies it into the execution metadata when the call ends,
// failed or not, so the session is charged for what was used.
type Meter struct {
	mu    sync.Mutex
	model *api.ModelUse
}

// SetModel records a model call's use, replacing an earlier record.
func (m *Meter) SetModel(u api.ModelUse) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.model = &u
	m.mu.Unlock()
}

// Model returns the recorded model use, or nil.
func (m *Meter) Model() *api.ModelUse {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.model
}

type meterKey struct{}

// WithMeter returns ctx carrying m.
func WithMeter(ctx context.Context, m *Meter) context.Context {
	return context.WithValue(ctx, meterKey{}, m)
}

// MeterFrom returns the Meter in ctx, or nil (whose methods do nothing).
func MeterFrom(ctx context.Context) *Meter {
	m, _ := ctx.Value(meterKey{}).(*Meter)
	return m
}
