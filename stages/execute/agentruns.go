package execute

import (
	"context"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
)

// AgentRuns counts each agent's running calls across every worker
// (*kvstore.Store): leases that lapse unless renewed.
type AgentRuns interface {
	ClaimAgentRun(ctx context.Context, tenant, agent, id string, limit int, now time.Time, ttl time.Duration) (bool, int, error)
	ReleaseAgentRun(ctx context.Context, tenant, agent, id string) error
}

var _ AgentRuns = (*kvstore.Store)(nil)

// AgentRunLease is how long a running call's slot outlives its last
// renewal: a worker that dies frees its calls' slots this long after.
// It is renewed every third of it while the call runs.
var AgentRunLease = 30 * time.Second

// claimAgentRun holds a slot of the calling agent for inv while it runs,
// or refuses it with E3106 when the agent already runs as many calls as
// m allows under the tenant's defaults d. Refused, the call is not
// queued: it ends, retryable, before the tenant's quota or the tool is
// touched. The returned func releases the slot; it is always safe to call.
func (x *Executor) claimAgentRun(ctx context.Context, inv *envelope.Invocation, m *tools.Manifest, d tools.Defaults) (func(), error) {
	if x.AgentRuns == nil || x.Defaults == nil {
		return func() {}, nil
	}
	tenant, agent, id := inv.Tenant, inv.Agent(), inv.ID
	limit := m.ConcurrentPerAgent(d)
	if limit >= tools.UncountedRuns {
		return func() {}, nil
	}
	held, running, err := x.AgentRuns.ClaimAgentRun(ctx, tenant, agent, id, limit, time.Now(), AgentRunLease)
	if err != nil {
		return nil, stages.Transient(err, 0)
	}
	if !held {
		return nil, api.NewError(api.RateLimitExceeded, api.EConcurrentLimit,
			"agent %s already has %d calls running, its limit for %s is %d; not queued, call again when one ends",
			agent, running, m.ID, limit).AsRetryable().
			WithDetail("running", running).WithDetail("limit", limit).
			WithDetail("retry_after_ms", int64(1000)).WithDetail("not_started", true)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(AgentRunLease / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				// A failed renewal is retried at the next tick; the
				// lease outlives two of them.
				_, _, _ = x.AgentRuns.ClaimAgentRun(context.WithoutCancel(ctx), tenant, agent, id, limit, time.Now(), AgentRunLease)
			}
		}
	}()
	return func() {
		close(stop)
		<-done
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unclaimTimeout)
		defer cancel()
		// Should the write fail, the lease lapses by itself.
		_ = x.AgentRuns.ReleaseAgentRun(rctx, tenant, agent, id)
	}, nil
}
