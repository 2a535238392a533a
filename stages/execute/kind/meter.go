package kind

import (
	"context"
	"sync"
	"time"

	"github.com/toolgate/toolgate/api"
)

// Meter is where a tool records what it consumed beyond its runtime: the
// tokens and cost of a model call. The execute stage puts one in the tool's
// context and copies it into the execution metadata when the call ends,
// failed or not, so the session is charged for what was used.
type Meter struct {
	mu    sync.Mutex
	model *api.ModelUse
	res   usage
	// cpuShare: whether a run applied the call's CPU share, and if not,
	// why (cpuWhy).
	cpuShare, cpuNoted bool
	cpuWhy             string
}

// NoteCPUShare records whether a run of the call applied its CPU share,
// and why not. One run without it makes the call's share not applied.
func (m *Meter) NoteCPUShare(applied bool, why string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.cpuNoted || !applied {
		m.cpuShare, m.cpuWhy = applied, why
	}
	m.cpuNoted = true
}

// CPUShare reports whether the call's CPU share was applied; noted is
// false when no run said (the kind runs no process of its own per call).
func (m *Meter) CPUShare() (applied, noted bool, why string) {
	if m == nil {
		return false, false, ""
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cpuShare, m.cpuNoted, m.cpuWhy
}

// usage is what a tool's processes used, where the kind can know it:
// CPU time, the peak resident memory, and network bytes in and out.
type usage struct {
	CPU                 time.Duration
	MaxRSSKB            int64
	NetIn, NetOut       int64
	measured, networked bool
}

// AddResources adds one process's figures: CPU and network bytes add up
// (retries included), memory is the peak of them all.
func (m *Meter) AddResources(cpu time.Duration, maxRSSKB int64, networked bool, netIn, netOut int64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.res.measured = true
	m.res.CPU += cpu
	m.res.MaxRSSKB = max(m.res.MaxRSSKB, maxRSSKB)
	if networked {
		m.res.networked = true
		m.res.NetIn += netIn
		m.res.NetOut += netOut
	}
}

// FillMetadata copies the recorded figures into md: CPU in millicore
// seconds (a millisecond of CPU time is one), memory in MB rounded up,
// network bytes only for a run that had network.
func (m *Meter) FillMetadata(md *api.ExecutionMetadata) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.res.measured {
		return
	}
	md.CPUUsedMillicoreSeconds = m.res.CPU.Milliseconds()
	md.MemoryPeakMB = (m.res.MaxRSSKB + 1023) / 1024
	if m.res.networked {
		in, out := m.res.NetIn, m.res.NetOut
		md.NetworkBytesIn, md.NetworkBytesOut = &in, &out
	}
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
