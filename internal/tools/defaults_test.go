package tools

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/api"
)

// TestImpossibleOverridesRefused: a manifest that overrides a default with
// a value nothing could honour is refused, naming the member.
func TestImpossibleOverridesRefused(t *testing.T) {
	tests := []struct {
		name, member, value, loc string
	}{
		{"zero window", "rate_limit", `{"requests": 5, "per_seconds": 0}`, "/rate_limit/per_seconds"},
		{"rate zero", "rate_limit", `{"requests": 0, "per_seconds": 60}`, "/rate_limit/requests"},
		{"negative burst", "rate_limit", `{"requests": 5, "per_seconds": 60, "burst": -1}`, "/rate_limit/burst"},
		{"burst past any sane bound", "rate_limit", `{"requests": 5, "per_seconds": 60, "burst": 2000000000}`, "/rate_limit/burst"},
		{"a window longer than a day", "rate_limit", `{"requests": 5, "per_seconds": 864000}`, "/rate_limit/per_seconds"},
		{"negative base delay", "retry_policy", `{"max_attempts": 3, "base_delay_ms": -5}`, "/retry_policy/base_delay_ms"},
		{"cap below base", "retry_policy", `{"max_attempts": 3, "base_delay_ms": 5000, "max_delay_ms": 10}`, "/retry_policy/max_delay_ms"},
		{"no attempt", "retry_policy", `{"max_attempts": 0}`, "/retry_policy/max_attempts"},
		{"zero breaker window", "circuit_breaker", `{"sliding_window_size": 0}`, "/circuit_breaker/sliding_window_size"},
		{"minimum past the window", "circuit_breaker", `{"sliding_window_size": 10, "minimum_calls": 20}`, "/circuit_breaker/minimum_calls"},
		{"rate over 100 %", "circuit_breaker", `{"failure_rate_threshold": 150}`, "/circuit_breaker/failure_rate_threshold"},
		{"open for a year", "circuit_breaker", `{"wait_duration_seconds": 31536000}`, "/circuit_breaker/wait_duration_seconds"},
		{"zero cpu", "limits", `{"cpu_millicores": 0}`, "/limits/cpu_millicores"},
		{"a million cores", "limits", `{"cpu_millicores": 1000000000}`, "/limits/cpu_millicores"},
		{"no concurrent call", "limits", `{"concurrent_per_agent": 0}`, "/limits/concurrent_per_agent"},
		{"memory past a terabyte", "limits", `{"memory_mb": 2000000000}`, "/limits/memory_mb"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Parse(manifestJSON(t, func(m map[string]any) { m[tt.member] = json.RawMessage(tt.value) }))
			if err == nil {
				t.Fatalf("Parse accepted %s %s: %+v", tt.member, tt.value, m)
			}
			te := api.AsError(err)
			want := api.EInvalidManifest
			if tt.member == "circuit_breaker" {
				want = api.EBreakerConfig // the specification's code for it
			}
			if te.ECode != want {
				t.Fatalf("ECode = %s, want %s (%v)", te.ECode, want, err)
			}
			if !hasField(te.Fields, tt.loc, "") {
				t.Fatalf("want a field error at %s, got %+v (%v)", tt.loc, te.Fields, err)
			}
		})
	}
}

// TestSeedDefaultsWhereSilent: a manifest that declares nothing gets the
// specification's values; one that declares them keeps its own.
func TestSeedDefaultsWhereSilent(t *testing.T) {
	silent := mustParse(t, manifestJSON(t, nil))
	d := (*Settings)(nil).For("acme")
	lim, perAgent, ok := silent.EffectiveRateLimit(d)
	if !ok || !perAgent || lim != (RateLimit{Requests: 60, PerSeconds: 60, Burst: 10}) {
		t.Fatalf("rate limit = %+v per agent %v ok %v", lim, perAgent, ok)
	}
	if silent.EffectiveRetry(d) != nil {
		t.Fatal("a tool not marked idempotent is retried by default")
	}
	cb := silent.WithBreaker(d).CircuitBreaker
	if cb == nil || *cb != (CircuitBreaker{FailureRateThreshold: 50, SlidingWindowSize: 100, MinimumCalls: 10, WaitDurationSeconds: 60, HalfOpenCalls: 10}) {
		t.Fatalf("breaker = %+v", cb)
	}
	if silent.CircuitBreaker != nil {
		t.Fatal("WithBreaker changed the registered manifest")
	}
	if silent.Timeout().Seconds() != 30 || silent.MemoryMB() != 1024 || silent.CPUMillicores() != 500 || silent.ConcurrentPerAgent(d) != 4 {
		t.Fatalf("timeout %v memory %d cpu %d concurrent %d", silent.Timeout(), silent.MemoryMB(), silent.CPUMillicores(), silent.ConcurrentPerAgent(d))
	}
	idem := mustParse(t, manifestJSON(t, func(m map[string]any) { m["safety"] = map[string]any{"idempotent": true} }))
	if rp := idem.EffectiveRetry(d); rp == nil || rp.MaxAttempts != 3 || rp.BaseDelayMS != 1000 || rp.MaxDelayMS != 60000 {
		t.Fatalf("retry of an idempotent tool = %+v", rp)
	}

	own := mustParse(t, manifestJSON(t, func(m map[string]any) {
		m["rate_limit"] = map[string]any{"requests": 5, "per_seconds": 1}
		m["limits"] = map[string]any{"concurrent_per_agent": 64, "cpu_millicores": 2000, "memory_mb": 64}
		m["circuit_breaker"] = map[string]any{"sliding_window_size": 5}
	}))
	if lim, perAgent, _ := own.EffectiveRateLimit(d); perAgent || lim.Requests != 5 {
		t.Fatalf("declared rate limit = %+v per agent %v", lim, perAgent)
	}
	if own.ConcurrentPerAgent(d) != 64 || own.CPUMillicores() != 2000 || own.MemoryMB() != 64 || own.WithBreaker(d).CircuitBreaker.SlidingWindowSize != 5 {
		t.Fatal("a declared value was replaced by a default")
	}
}

// TestTenantDefaults: a tenant's defaults replace the deployment's member by
// member, and impossible ones are refused naming the member.
func TestTenantDefaults(t *testing.T) {
	s := &Settings{Tenants: map[string]Defaults{"bulk": {RateLimit: &RateLimit{Requests: 6000, PerSeconds: 60}, ConcurrentToolsPerAgent: 32}}}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	bulk, other := s.For("bulk"), s.For("acme")
	if bulk.RateLimit.Requests != 6000 || bulk.ConcurrentToolsPerAgent != 32 || bulk.RetryPolicy.MaxAttempts != 3 {
		t.Fatalf("bulk = %+v", bulk)
	}
	if other.RateLimit.Requests != 60 || other.ConcurrentToolsPerAgent != 4 {
		t.Fatalf("another tenant got bulk's defaults: %+v", other)
	}
	for name, tc := range map[string]struct {
		s   Settings
		loc string
	}{
		"tenant rate 0":    {Settings{Tenants: map[string]Defaults{"x": {RateLimit: &RateLimit{Requests: 0, PerSeconds: 60}}}}, "/tenants/x/rate_limit/requests"},
		"negative runs":    {Settings{Tenants: map[string]Defaults{"x": {ConcurrentToolsPerAgent: -1}}}, "/tenants/x/concurrent_tools_per_agent"},
		"tenant's breaker": {Settings{Tenants: map[string]Defaults{"x": {CircuitBreaker: &CircuitBreaker{SlidingWindowSize: 5}}}}, "/tenants/x/circuit_breaker"},
		"base cap < base":  {Settings{Base: Defaults{RetryPolicy: &RetryPolicy{MaxAttempts: 2, BaseDelayMS: 10, MaxDelayMS: 1}}}, "/retry_policy/max_delay_ms"},
	} {
		err := tc.s.Check()
		if err == nil || !hasField(api.AsError(err).Fields, tc.loc, "") || !strings.Contains(err.Error(), tc.loc) {
			t.Errorf("%s: Check = %v, want a field error at %s", name, err, tc.loc)
		}
	}
}
