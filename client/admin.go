package client

import (
	"context"
	"encoding/json"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// The administrative methods call the control service's operator endpoints
// (control API 1.3), signed with c.Sign. Each change is audited and
// records the signing operator; the by arguments count only on a bus
// without authentication.

func (c *Operator) admin(ctx context.Context, subject string, in, out any) error {
	return c.requestSigned(ctx, subject, in, out, c.Sign)
}

// PushPolicy makes modules (Rego by file name) and data the authorization
// and capability grant policy of every worker and the control service.
// A policy that does not compile is refused (E3206).
func (c *Operator) PushPolicy(ctx context.Context, modules map[string]string, data map[string]any, by string) (api.PolicyPushResponse, error) {
	var out api.PolicyPushResponse
	err := c.admin(ctx, subjects.SvcPolicyPush, api.PolicyPushRequest{Modules: modules, Data: data, By: by}, &out)
	return out, err
}

// ResetPolicy removes the pushed policy: workers return to their
// configured one.
func (c *Operator) ResetPolicy(ctx context.Context, by string) (api.PolicyResetResponse, error) {
	var out api.PolicyResetResponse
	err := c.admin(ctx, subjects.SvcPolicyReset, map[string]string{"by": by}, &out)
	return out, err
}

// Policy returns the pushed policy (Pushed false when none was).
func (c *Operator) Policy(ctx context.Context) (api.PolicyBundle, error) {
	var out api.PolicyBundle
	err := c.admin(ctx, subjects.SvcPolicyGet, struct{}{}, &out)
	return out, err
}

// PushHooks makes doc (a hook set as JSON) tenant's hooks. Hooks that do
// not compile are refused (E3800).
func (c *Operator) PushHooks(ctx context.Context, tenant string, doc json.RawMessage, by string) (api.HooksPushResponse, error) {
	var out api.HooksPushResponse
	err := c.admin(ctx, subjects.SvcHooksPush, api.HooksPushRequest{TenantID: tenant, Doc: doc, By: by}, &out)
	return out, err
}

// HookSets lists the pushed hook sets, only tenant's when it is not empty.
func (c *Operator) HookSets(ctx context.Context, tenant string) ([]api.HookSet, error) {
	var out api.HooksResponse
	err := c.admin(ctx, subjects.SvcHooksList, api.HooksRequest{TenantID: tenant}, &out)
	return out.HookSets, err
}

// DeleteHooks removes tenant's hooks.
func (c *Operator) DeleteHooks(ctx context.Context, tenant, by string) error {
	var out api.HooksRequest
	return c.admin(ctx, subjects.SvcHooksDelete, api.HooksRequest{TenantID: tenant, By: by}, &out)
}

// RevokeToken revokes the token jti and every token derived from it until
// until; the bus closes their connections.
func (c *Operator) RevokeToken(ctx context.Context, jti string, until time.Time, reason, by string) (api.RevokeResponse, error) {
	var out api.RevokeResponse
	err := c.admin(ctx, subjects.SvcTokensRevoke, api.RevokeRequest{JTI: jti, Until: until, Reason: reason, By: by}, &out)
	return out, err
}

// Breakers lists the circuit breakers.
func (c *Operator) Breakers(ctx context.Context) ([]api.BreakerState, error) {
	var out api.BreakersResponse
	err := c.admin(ctx, subjects.SvcBreakersList, struct{}{}, &out)
	return out.Breakers, err
}

// SetBreaker forces breaker key open (api.BreakerOpen) or closed
// (api.BreakerClosed), or releases it to its failure counting
// (api.BreakerRelease).
func (c *Operator) SetBreaker(ctx context.Context, key, state, by string) (api.BreakerState, error) {
	var out api.BreakerState
	err := c.admin(ctx, subjects.SvcBreakersSet, api.BreakerSetRequest{Key: key, State: state, By: by}, &out)
	return out, err
}

// RegisterModel registers or replaces a model from its document and
// returns it as stored (defaults filled).
func (c *Operator) RegisterModel(ctx context.Context, doc json.RawMessage, by string) (json.RawMessage, error) {
	var out json.RawMessage
	err := c.admin(ctx, subjects.SvcModelsRegister, api.ModelRequest{Model: doc, By: by}, &out)
	return out, err
}

// Models lists the model catalogue's documents.
func (c *Operator) Models(ctx context.Context) ([]json.RawMessage, error) {
	var out api.ModelsResponse
	err := c.admin(ctx, subjects.SvcModelsList, struct{}{}, &out)
	return out.Models, err
}

// DeleteModel removes a model from the catalogue (E3850 when unknown).
func (c *Operator) DeleteModel(ctx context.Context, name, by string) error {
	var out api.ModelRequest
	return c.admin(ctx, subjects.SvcModelsDelete, api.ModelRequest{Name: name, By: by}, &out)
}

// SetRoutingPolicy replaces the model routing policy with rego, or
// restores the shipped one when rego is empty.
func (c *Operator) SetRoutingPolicy(ctx context.Context, rego, by string) error {
	var out api.RoutingPolicyRequest
	return c.admin(ctx, subjects.SvcModelsPolicy, api.RoutingPolicyRequest{Rego: rego, Reset: rego == "", By: by}, &out)
}

// Budgets lists the capped sessions of tenant (every tenant's when "")
// that have used at least near (0 to 1) of a cap, nearest first.
func (c *Operator) Budgets(ctx context.Context, tenant string, near float64) ([]api.BudgetStatus, error) {
	var out api.BudgetsResponse
	err := c.admin(ctx, subjects.SvcBudgetsList, api.BudgetsRequest{TenantID: tenant, Near: near}, &out)
	return out.Budgets, err
}
