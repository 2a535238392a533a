package authorize

import (
	"context"
	"errors"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
)

// reserveTree charges one call to the token's own budget (a child's) and to
// its tree's, the root's: a child's call is refused when either is spent.
// The own charge is undone when the tree refuses. charged says the own
// budget shows the call charged already: a leased call is then not given
// another (a reservation with compare-and-swap finds its own).
func (a *Authorizer) reserveTree(ctx context.Context, inv *envelope.Invocation, c *token.Claims, tree, own string, m *tools.Manifest, judged kvstore.Usage, charged bool) error {
	if own == tree {
		if leasable(c.Budget) {
			if charged {
				return nil
			}
			return a.leases.reserve(ctx, inv, c.Budget, tree)
		}
		return a.reserve(ctx, inv, c.Budget, tree, m, &judged)
	}
	if err := a.reserve(ctx, inv, c.Budget, own, m, &judged); err != nil {
		return err
	}
	err := a.reserve(ctx, inv, c.TreeBudget(), tree, m, nil)
	if err == nil {
		return nil
	}
	_, uerr := a.cfg.Store.UpdateUsage(ctx, inv.Tenant, own, func(u *kvstore.Usage) error {
		if !u.Unreserve(inv.ID) {
			return errAlreadyReserved // nothing to undo
		}
		u.Calls--
		u.Release(inv.ID)
		return nil
	})
	if uerr != nil && !errors.Is(uerr, errAlreadyReserved) {
		return stages.Transient(uerr, 0) // retried: the own charge is found and kept
	}
	return err
}

func sessionAborted(ab kvstore.Abort) error {
	return api.NewError(api.PermissionDenied, api.ESessionAborted,
		"the session was ended by hook %s when invocation %s ended", ab.Hook, ab.InvocationID).
		WithDetail("aborted_by", ab.InvocationID)
}

// reserve charges one call to the usage under key with compare-and-swap, so
// concurrent calls on many workers never pass max_calls; runtime, cost and
// tokens are charged when calls end, so they can be overspent at most by the
// calls in flight. With judged, the usage the policy saw, the call is
// reserved only on that usage, its calls aside (max_calls is checked here
// on the stored count): if it moved, errUsageMoved.
func (a *Authorizer) reserve(ctx context.Context, inv *envelope.Invocation, b *token.Budget, key string, m *tools.Manifest, judged *kvstore.Usage) error {
	held, _ := ctx.Value(modelHoldKey{}).(*modelHold)
	var wait time.Duration
	var refused error // a refusal that still writes (stale leases dropped)
	_, err := a.cfg.Store.UpdateUsage(ctx, inv.Tenant, key, func(u *kvstore.Usage) error {
		refused = nil
		if ab := u.Aborted; ab != nil {
			return sessionAborted(*ab)
		}
		if u.Charged(inv.ID) {
			if h, ok := u.HoldOf(inv.ID); ok {
				held.set(h.Tokens, h.Cost) // a retry hands on what it held
			}
			return errAlreadyReserved
		}
		if judged != nil && moved(*judged, *u) {
			return errUsageMoved
		}
		now := a.cfg.Now()
		dropped := u.DropStaleLeases(now.Add(-leaseGrace))
		if b != nil {
			u.Limits = limitsOf(b)
			var perCall float64
			if m.Cost != nil {
				perCall = m.Cost.PerCall
			}
			switch {
			case b.MaxCalls > 0 && u.Calls >= b.MaxCalls && len(u.Leases) > 0:
				wait = leaseWait(u.Leases, now)
				return errLeasedElsewhere
			case b.MaxCalls > 0 && u.Calls >= b.MaxCalls:
				refused = exhausted("the token has made all %d of its calls", b.MaxCalls)
			case b.MaxRuntimeMS > 0 && u.RuntimeMS >= b.MaxRuntimeMS:
				refused = exhausted("the token has used its %d ms of runtime", b.MaxRuntimeMS)
			case b.MaxCost > 0 && u.Cost+perCall > b.MaxCost:
				refused = exhausted("the call would take the token's cost over %g", b.MaxCost)
			case b.MaxTokens > 0 && u.Tokens >= b.MaxTokens:
				refused = exhausted("the token has used its %d tokens", b.MaxTokens)
			}
			if refused == nil && m.Kind == "model" && (b.MaxTokens > 0 || b.MaxCost > 0) {
				// A model call holds all the budget leaves free before it
				// runs; audit releases what it did not use.
				heldTokens, heldCost := u.Held()
				tokens, cost := b.MaxTokens-u.Tokens-heldTokens, b.MaxCost-u.Cost-heldCost-perCall
				switch {
				case (b.MaxTokens > 0 && tokens <= 0) || (b.MaxCost > 0 && cost <= 0):
					if len(u.Holds) > 0 {
						return errHeldElsewhere // released when those calls end
					}
					refused = exhausted("the token has no tokens or cost left for a model call")
				default:
					if b.MaxTokens <= 0 {
						tokens = 0
					}
					if b.MaxCost <= 0 {
						cost = 0
					}
					u.Hold(inv.ID, tokens, cost)
					held.set(tokens, cost)
				}
			}
			if refused != nil {
				if dropped {
					return nil // the stale leases' drop is written, the call refused
				}
				return refused
			}
		}
		u.Calls++
		u.Reserve(inv.ID)
		return nil
	})
	var te *api.Error
	switch {
	case err == nil && refused != nil:
		return refused
	case err == nil, errors.Is(err, errAlreadyReserved):
		return nil
	case errors.As(err, &te), errors.Is(err, errUsageMoved):
		return err
	case errors.Is(err, errLeasedElsewhere):
		return stages.Transient(err, wait)
	case errors.Is(err, errHeldElsewhere):
		return stages.Transient(err, 200*time.Millisecond)
	}
	return stages.Transient(err, 0)
}

// errHeldElsewhere: the budget's tokens or cost are held by model calls in
// flight; the call is tried again once they may have ended.
var errHeldElsewhere = errors.New("the budget is held by model calls in flight")

// modelHold is what a model call may use: the least of what reserve held
// of each budget it charged (the token's own and its tree's).
type modelHold struct {
	tokens int64
	cost   float64
}

type modelHoldKey struct{}

func (h *modelHold) set(tokens int64, cost float64) {
	if h == nil {
		return
	}
	if tokens > 0 && (h.tokens == 0 || tokens < h.tokens) {
		h.tokens = tokens
	}
	if cost > 0 && (h.cost == 0 || cost < h.cost) {
		h.cost = cost
	}
}

// moved reports whether the usage a policy judged differs from the stored
// one in anything the policy sees but the count of calls.
func moved(judged, stored kvstore.Usage) bool {
	return judged.RuntimeMS != stored.RuntimeMS || judged.Cost != stored.Cost || judged.Tokens != stored.Tokens ||
		judged.ConsecutiveFailures != stored.ConsecutiveFailures || (judged.Aborted == nil) != (stored.Aborted == nil) ||
		!judged.StartedAt.Equal(stored.StartedAt)
}

var errAlreadyReserved = errors.New("already reserved")

// limitsOf is b as the usage record keeps it, so readers without the
// token see how near the session is to its caps.
func limitsOf(b *token.Budget) api.BudgetLimits {
	return api.BudgetLimits{MaxCalls: b.MaxCalls, MaxRuntimeMS: b.MaxRuntimeMS, MaxCost: b.MaxCost, MaxTokens: b.MaxTokens}
}

func exhausted(format string, args ...any) error {
	return api.NewError(api.ResourceExhausted, api.EBudgetExhausted, "budget exhausted: "+format, args...)
}
