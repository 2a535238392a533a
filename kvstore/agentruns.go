package kvstore

import (
	"context"
	"fmt"
	"time"

	"github.com/toolgate/toolgate/subjects"
)

// agentRunKeys is the key prefix of each agent's running calls, in a
// bucket only execute writes (subjects.BucketAgentRuns).
const agentRunKeys = "_running"

// AgentRuns are one agent's running calls: invocation id → when its lease
// ends. A lease is renewed while its call runs, so one whose worker died
// lapses instead of holding the agent's slot for ever.
type AgentRuns struct {
	Leases map[string]time.Time `json:"leases"`
}

func agentRunsKey(tenant, agent string) string {
	return agentRunKeys + "." + subjects.Token(tenant) + "." + subjects.Token(agent)
}

// ClaimAgentRun gives the call id of agent a lease until now+ttl, unless
// the agent already holds limit unexpired leases of other calls. It
// returns whether the lease is held and how many the agent holds (this one
// included when held). Claiming again renews: a redelivered call keeps its
// own slot rather than taking a second. Compare-and-swap, so several
// workers never admit more than limit together.
func (s *Store) ClaimAgentRun(ctx context.Context, tenant, agent, id string, limit int, now time.Time, ttl time.Duration) (bool, int, error) {
	held := false
	runs, _, err := update(ctx, s.agentruns, agentRunsKey(tenant, agent), func(r *AgentRuns, exists bool) error {
		held = false
		if r.Leases == nil {
			r.Leases = map[string]time.Time{}
		}
		for k, until := range r.Leases {
			if !now.Before(until) {
				delete(r.Leases, k)
			}
		}
		if _, mine := r.Leases[id]; !mine && len(r.Leases) >= limit {
			return ErrUnchanged
		}
		r.Leases[id] = now.Add(ttl)
		held = true
		return nil
	})
	if err != nil {
		return false, 0, fmt.Errorf("running calls of agent %s in %s: %w", agent, tenant, err)
	}
	return held, len(runs.Leases), nil
}

// ReleaseAgentRun ends the lease of call id of agent.
func (s *Store) ReleaseAgentRun(ctx context.Context, tenant, agent, id string) error {
	_, _, err := update(ctx, s.agentruns, agentRunsKey(tenant, agent), func(r *AgentRuns, exists bool) error {
		if _, ok := r.Leases[id]; !ok {
			return ErrUnchanged
		}
		delete(r.Leases, id)
		return nil
	})
	if err != nil {
		return fmt.Errorf("releasing a running call of agent %s in %s: %w", agent, tenant, err)
	}
	return nil
}
