package tools

import (
	"cmp"
	"fmt"
	"time"

	"github.com/toolgate/toolgate/api"
)

// Defaults are what applies where a manifest is silent: the specification's
// executor and adapter defaults, which a tenant may replace member by member
// (Settings). A zero member means "not set here".
type Defaults struct {
	// RateLimit bounds each agent's calls of each tool.
	RateLimit *RateLimit `json:"rate_limit,omitempty"`
	// RetryPolicy retries idempotent tools.
	RetryPolicy *RetryPolicy `json:"retry_policy,omitempty"`
	// CircuitBreaker guards each tool. Breakers are shared by every tenant
	// calling a tool, so only the deployment's defaults set it.
	CircuitBreaker *CircuitBreaker `json:"circuit_breaker,omitempty"`
	// ConcurrentToolsPerAgent is how many calls one agent may have running
	// at once; over it a call is refused with E3106.
	ConcurrentToolsPerAgent int `json:"concurrent_tools_per_agent,omitempty"`
}

// The specification's values where a manifest is silent.
const (
	DefaultMemoryMB      = 1024
	DefaultCPUMillicores = 500
	// DefaultConcurrentToolsPerAgent: see Defaults.ConcurrentToolsPerAgent.
	DefaultConcurrentToolsPerAgent = 4
)

// SeedDefaults returns the specification's defaults: 60 calls a minute per
// agent and tool with a burst of 10; three attempts for idempotent tools,
// 1 s base and 60 s cap, full jitter; a breaker opening at 50 % failures of
// the last 100 calls (at least 10), open 60 s, 10 trial calls; 4 calls
// running per agent.
func SeedDefaults() Defaults {
	return Defaults{
		RateLimit:               &RateLimit{Requests: 60, PerSeconds: 60, Burst: 10},
		RetryPolicy:             &RetryPolicy{MaxAttempts: 3, BaseDelayMS: 1000, MaxDelayMS: 60_000},
		CircuitBreaker:          &CircuitBreaker{FailureRateThreshold: 50, SlidingWindowSize: 100, MinimumCalls: 10, WaitDurationSeconds: 60, HalfOpenCalls: 10},
		ConcurrentToolsPerAgent: DefaultConcurrentToolsPerAgent,
	}
}

// Sane upper bounds: a value past one is a mistake, not a wish.
const (
	maxRequests       = 1_000_000 // per window
	maxBurst          = 1_000_000
	maxDelayMS        = int64(time.Hour / time.Millisecond)
	maxWindow         = 100_000 // calls in a breaker's window
	maxWaitSeconds    = 24 * 3600
	maxCPUMillicores  = 1_024_000 // 1024 cores
	maxMemoryMB       = 1 << 20   // 1 TiB
	maxConcurrentRuns = UncountedRuns
)

// UncountedRuns, the largest concurrent_per_agent, leaves a tool's calls
// uncounted: two compare-and-swaps on one key per call would cost an agent
// that fires thousands of them more than any bound this high could save.
const UncountedRuns = 100_000

// Settings resolve the defaults of each tenant: Tenants[tenant] member by
// member over Base over SeedDefaults. A nil *Settings is SeedDefaults.
type Settings struct {
	Base    Defaults
	Tenants map[string]Defaults
}

// For returns the defaults that apply to tenant's calls.
func (s *Settings) For(tenant string) Defaults {
	d := SeedDefaults()
	if s == nil {
		return d
	}
	d = s.Base.over(d)
	if t, ok := s.Tenants[tenant]; ok {
		breaker := d.CircuitBreaker
		d = t.over(d)
		d.CircuitBreaker = breaker
	}
	return d
}

// over returns d with each member of o that is set.
func (o Defaults) over(d Defaults) Defaults {
	d.RateLimit = cmp.Or(o.RateLimit, d.RateLimit)
	d.RetryPolicy = cmp.Or(o.RetryPolicy, d.RetryPolicy)
	d.CircuitBreaker = cmp.Or(o.CircuitBreaker, d.CircuitBreaker)
	d.ConcurrentToolsPerAgent = cmp.Or(o.ConcurrentToolsPerAgent, d.ConcurrentToolsPerAgent)
	return d
}

// Check refuses settings with an impossible value, naming it.
func (s *Settings) Check() error {
	if s == nil {
		return nil
	}
	if f := s.Base.check("/"); len(f) > 0 {
		return fieldsError("default settings", f)
	}
	for tenant, d := range s.Tenants {
		if d.CircuitBreaker != nil {
			return fieldsError("defaults of tenant "+tenant, []api.FieldError{{Location: "/tenants/" + tenant + "/circuit_breaker",
				Message: "a breaker is shared by every tenant calling a tool; only the deployment's defaults set it"}})
		}
		if f := d.check("/tenants/" + tenant + "/"); len(f) > 0 {
			return fieldsError("defaults of tenant "+tenant, f)
		}
	}
	return nil
}

func fieldsError(what string, f []api.FieldError) error {
	return invalid("%s: %s: %s", what, f[0].Location, f[0].Message).WithFields(f)
}

// check lists d's impossible values, located under prefix.
func (d Defaults) check(prefix string) []api.FieldError {
	var out []api.FieldError
	out = append(out, checkRate(prefix+"rate_limit", d.RateLimit)...)
	out = append(out, checkRetry(prefix+"retry_policy", d.RetryPolicy)...)
	out = append(out, checkBreaker(prefix+"circuit_breaker", d.CircuitBreaker)...)
	if n := d.ConcurrentToolsPerAgent; n < 0 || n > maxConcurrentRuns {
		out = append(out, bad(prefix+"concurrent_tools_per_agent", "must be between 1 and %d, not %d", maxConcurrentRuns, n))
	}
	return out
}

// checkOverrides lists the impossible values of the members by which a
// manifest overrides the defaults. The schema has already refused
// negatives and zeros where a member has a minimum; what is left are values
// past any sane bound and members that contradict each other.
func (m *Manifest) checkOverrides() []api.FieldError {
	var out []api.FieldError
	out = append(out, checkRate("/rate_limit", m.RateLimit)...)
	out = append(out, checkRetry("/retry_policy", m.RetryPolicy)...)
	out = append(out, checkBreaker("/circuit_breaker", m.CircuitBreaker)...)
	l := m.Limits
	if l.CPUMillicores < 0 || l.CPUMillicores > maxCPUMillicores {
		out = append(out, bad("/limits/cpu_millicores", "must be between 1 and %d, not %d", maxCPUMillicores, l.CPUMillicores))
	}
	if l.MemoryMB < 0 || l.MemoryMB > maxMemoryMB {
		out = append(out, bad("/limits/memory_mb", "must be between 1 and %d, not %d", maxMemoryMB, l.MemoryMB))
	}
	if n := l.ConcurrentPerAgent; n < 0 || n > maxConcurrentRuns {
		out = append(out, bad("/limits/concurrent_per_agent", "must be between 1 and %d, not %d", maxConcurrentRuns, n))
	}
	return out
}

func bad(loc, format string, args ...any) api.FieldError {
	return api.FieldError{Location: loc, Message: fmt.Sprintf(format, args...)}
}

func checkRate(loc string, r *RateLimit) []api.FieldError {
	if r == nil {
		return nil
	}
	var out []api.FieldError
	if r.Requests < 1 || r.Requests > maxRequests {
		out = append(out, bad(loc+"/requests", "must be between 1 and %d, not %d", maxRequests, r.Requests))
	}
	if r.PerSeconds < 1 || r.PerSeconds > 86_400 {
		out = append(out, bad(loc+"/per_seconds", "must be between 1 and 86400 (a day), not %d", r.PerSeconds))
	}
	if r.Burst < 0 || r.Burst > maxBurst {
		out = append(out, bad(loc+"/burst", "must be between 0 and %d, not %d", maxBurst, r.Burst))
	}
	return out
}

func checkRetry(loc string, r *RetryPolicy) []api.FieldError {
	if r == nil {
		return nil
	}
	var out []api.FieldError
	if r.MaxAttempts < 0 || r.MaxAttempts > 10 {
		out = append(out, bad(loc+"/max_attempts", "must be between 1 and 10, not %d", r.MaxAttempts))
	}
	if r.BaseDelayMS < 0 || r.BaseDelayMS > maxDelayMS {
		out = append(out, bad(loc+"/base_delay_ms", "must be between 0 and %d (an hour), not %d", maxDelayMS, r.BaseDelayMS))
	}
	if r.MaxDelayMS < 0 || r.MaxDelayMS > maxDelayMS {
		out = append(out, bad(loc+"/max_delay_ms", "must be between 0 and %d (an hour), not %d", maxDelayMS, r.MaxDelayMS))
	} else if r.MaxDelayMS > 0 && r.BaseDelayMS > r.MaxDelayMS {
		out = append(out, bad(loc+"/max_delay_ms", "%d is below base_delay_ms %d", r.MaxDelayMS, r.BaseDelayMS))
	}
	return out
}

func checkBreaker(loc string, c *CircuitBreaker) []api.FieldError {
	if c == nil {
		return nil
	}
	var out []api.FieldError
	if c.FailureRateThreshold < 0 || c.FailureRateThreshold > 100 {
		out = append(out, bad(loc+"/failure_rate_threshold", "must be a percentage, not %v", c.FailureRateThreshold))
	}
	if c.SlidingWindowSize < 0 || c.SlidingWindowSize > maxWindow {
		out = append(out, bad(loc+"/sliding_window_size", "must be between 1 and %d, not %d", maxWindow, c.SlidingWindowSize))
	}
	if c.MinimumCalls < 0 || c.SlidingWindowSize > 0 && c.MinimumCalls > c.SlidingWindowSize {
		out = append(out, bad(loc+"/minimum_calls", "%d cannot be reached in a window of %d calls", c.MinimumCalls, c.SlidingWindowSize))
	}
	if c.WaitDurationSeconds < 0 || c.WaitDurationSeconds > maxWaitSeconds {
		out = append(out, bad(loc+"/wait_duration_seconds", "must be between 1 and %d (a day), not %d", maxWaitSeconds, c.WaitDurationSeconds))
	}
	if c.HalfOpenCalls < 0 || c.HalfOpenCalls > maxWindow {
		out = append(out, bad(loc+"/half_open_calls", "must be between 1 and %d, not %d", maxWindow, c.HalfOpenCalls))
	}
	if c.WindowSeconds < 0 || c.WindowSeconds > maxWaitSeconds {
		out = append(out, bad(loc+"/window_seconds", "must be between 1 and %d (a day), not %d", maxWaitSeconds, c.WindowSeconds))
	}
	return out
}

// EffectiveRateLimit is the limit on calls of m: the manifest's, per tenant
// (perAgent false), or else d's, per agent.
func (m *Manifest) EffectiveRateLimit(d Defaults) (lim RateLimit, perAgent, ok bool) {
	if m.RateLimit != nil {
		return *m.RateLimit, false, true
	}
	if d.RateLimit == nil {
		return RateLimit{}, false, false
	}
	return *d.RateLimit, true, true
}

// EffectiveRetry is how failed calls of m are retried: the manifest's
// policy, or else d's for an idempotent tool; nil means never. A model
// tool gets no default: its router already retries each model of the
// chain and then falls back (seed 000, 2.7), and retrying the whole chain
// on top would multiply the attempts and trip the models' breakers.
func (m *Manifest) EffectiveRetry(d Defaults) *RetryPolicy {
	if m.RetryPolicy != nil {
		return m.RetryPolicy
	}
	if m.Safety.Idempotent && m.Kind != "model" {
		return d.RetryPolicy
	}
	return nil
}

// WithBreaker returns m, or, when m declares no breaker, a copy of m with
// d's: the breaker a call of m goes through.
func (m *Manifest) WithBreaker(d Defaults) *Manifest {
	if m.CircuitBreaker != nil || d.CircuitBreaker == nil {
		return m
	}
	c := *m
	cb := *d.CircuitBreaker
	c.CircuitBreaker = &cb
	return &c
}

// ConcurrentPerAgent is how many running calls of one agent a call of m
// may join: the manifest's limits.concurrent_per_agent, or else d's.
func (m *Manifest) ConcurrentPerAgent(d Defaults) int {
	return cmp.Or(int(m.Limits.ConcurrentPerAgent), d.ConcurrentToolsPerAgent, DefaultConcurrentToolsPerAgent)
}

// MemoryMB is the memory limit of one run of m: the manifest's, or the
// specification's 1024 MB.
func (m *Manifest) MemoryMB() int64 { return cmp.Or(m.Limits.MemoryMB, DefaultMemoryMB) }

// CPUMillicores is the CPU share of one run of m: the manifest's, or the
// specification's 500 millicores (half a core).
func (m *Manifest) CPUMillicores() int64 {
	return cmp.Or(m.Limits.CPUMillicores, DefaultCPUMillicores)
}
