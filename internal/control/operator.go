package control

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/toolgate/toolgate/internal/signedstate"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/breaker"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/hooks"
	"github.com/toolgate/toolgate/internal/modelrouter"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// The administrative endpoints (control API 1.3) are the one surface for an
// operator's changes to policy, hooks, revocations, breakers and models:
// the CLI calls them instead of writing the buckets. Who made a change is
// the identity that signed the request (WithDeciders), never the body's
// "by"; each change is audited.

// adminStore is what the administrative endpoints read and write
// (*kvstore.Store).
type adminStore interface {
	breaker.Store
	PushPolicy(ctx context.Context, b kvstore.PolicyBundle) (uint64, error)
	Policy(ctx context.Context) (kvstore.PolicyBundle, bool, error)
	DeletePolicy(ctx context.Context) error
	WatchPolicy(ctx context.Context, fn func(b kvstore.PolicyBundle, ok bool, err error)) error
	PushHooks(ctx context.Context, set kvstore.HookSet) (uint64, error)
	HookSets(ctx context.Context) ([]kvstore.HookSet, error)
	DeleteHooks(ctx context.Context, tenant string) error
	Revoke(ctx context.Context, jti string, until time.Time, reason, by string, proof *api.DecisionProof) error
	Breakers(ctx context.Context) ([]kvstore.BreakerState, error)
	PutSignedModel(ctx context.Context, data []byte, by string, proof *api.DecisionProof) (modelrouter.Model, error)
	Models(ctx context.Context) ([]modelrouter.Model, error)
	DeleteModel(ctx context.Context, name string) error
	PutSignedRoutingPolicy(ctx context.Context, src []byte, by string, proof *api.DecisionProof) error
	Budgets(ctx context.Context, tenant string) ([]kvstore.SessionUsage, error)
	docSourceStore
}

var _ adminStore = (*kvstore.Store)(nil)

// adminEndpoints are the administrative endpoints with their handlers.
func (h *handlers) adminEndpoints() map[string]micro.HandlerFunc {
	return map[string]micro.HandlerFunc{
		subjects.SvcPolicyPush:     h.pushPolicy,
		subjects.SvcPolicyGet:      h.getPolicy,
		subjects.SvcPolicyReset:    h.resetPolicy,
		subjects.SvcHooksPush:      h.pushHooks,
		subjects.SvcHooksList:      h.listHooks,
		subjects.SvcHooksDelete:    h.deleteHooks,
		subjects.SvcTokensRevoke:   h.revoke,
		subjects.SvcBreakersList:   h.listBreakers,
		subjects.SvcBreakersSet:    h.setBreaker,
		subjects.SvcModelsRegister: h.registerModel,
		subjects.SvcModelsList:     h.listModels,
		subjects.SvcModelsDelete:   h.deleteModel,
		subjects.SvcModelsPolicy:   h.routingPolicy,
		subjects.SvcBudgetsList:    h.listBudgets,

		// The document bridge's sources.
		subjects.SvcDocsSourceAdd:    h.addDocSource,
		subjects.SvcDocsSourceList:   h.listDocSources,
		subjects.SvcDocsSourceRemove: h.removeDocSource,
	}
}

// operator names who sends an administrative request: the identity that
// signed it when the service identifies callers (an authenticated bus),
// else the body's by. A request whose signature does not verify is refused
// with E3219, one signed by a role that may not send it (an approver's,
// an auditor's) with E3245, and ok is false (signedBy). Reads are signed
// too: the policy and hooks hold what admins alone should see.
func (h *handlers) operator(req micro.Request, by string) (who string, ok bool) {
	return h.signedBy(req, by, api.EAdminUnverified, "an administrative request")
}

// proof is the signed request a stored record keeps so that its readers
// can check an operator made it (internal/signedstate); nil on a bus
// without authentication.
func (h *handlers) proof(req micro.Request) *api.DecisionProof {
	if h.identify == nil {
		return nil
	}
	return &api.DecisionProof{Subject: req.Subject(), Headers: req.Headers(), Body: req.Data()}
}

// decodeAdmin decodes an administrative request (an empty body is {}) and
// names its sender; on failure it has answered and ok is false.
func (h *handlers) decodeAdmin(req micro.Request, v any, by func() string, expected string) (who string, ok bool) {
	if len(req.Data()) > 0 {
		if err := json.Unmarshal(req.Data(), v); err != nil {
			respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, "expected %s", expected))
			return "", false
		}
	}
	return h.operator(req, by())
}

// auditAdmin appends an ai.agent.admin.* event of c under tenant _system.
func (h *handlers) auditAdmin(ctx context.Context, typ string, c api.AdminChange) error {
	c.At = time.Now().UTC()
	// A change the operator credential signed is break-glass: named people
	// (admin:<name>) make the everyday ones.
	c.BreakGlass = h.identify != nil && breakGlass(c.By)
	e := event.New()
	e.SetID(uuid.NewString())
	e.SetSource("urn:toolgate:control")
	e.SetType(typ)
	if c.Target != "" {
		e.SetSubject(c.Target)
	}
	e.SetTime(c.At)
	if err := e.SetData(event.ApplicationJSON, c); err != nil {
		return err
	}
	o, err := stages.EventOutput(subjects.AuditEvent(subjects.SystemTenant, envelope.SubjectSuffix(typ)), &e)
	if err != nil {
		return err
	}
	return h.publish(ctx, o)
}

// audited audits a change that was made and answers out, or the audit's
// failure: a change the trail does not hold is not answered as if all went
// well (the change stands; the operator learns the trail missed it).
func (h *handlers) audited(ctx context.Context, req micro.Request, typ string, c api.AdminChange, out any) {
	if err := h.auditAdmin(ctx, typ, c); err != nil {
		respondError(req, api.WrapError(err, api.InternalError, api.EInternal, "the change was made but not audited: %v", err))
		return
	}
	_ = req.RespondJSON(out)
}

func adminContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

// pushPolicy compiles the authorization policy and its capability grant
// rule, stores the bundle for every authorize worker and this service's
// grants, and answers once this service grants by it.
func (h *handlers) pushPolicy(req micro.Request) {
	var r api.PolicyPushRequest
	who, ok := h.decodeAdmin(req, &r, func() string { return r.By }, `{"modules":{"name.rego":"…"}, "data":{…}}`)
	if !ok {
		return
	}
	if len(r.Modules) == 0 {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, "the policy has no modules"))
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	// A policy that does not compile never reaches a worker.
	if _, err := policy.New(ctx, r.Modules, r.Data); err != nil {
		respondError(req, err)
		return
	}
	if _, err := policy.NewGrants(ctx, r.Modules, r.Data); err != nil {
		respondError(req, err)
		return
	}
	b := kvstore.PolicyBundle{Modules: r.Modules, Data: r.Data, PushedBy: who}
	if h.identify != nil {
		b.Proof = &api.DecisionProof{Subject: req.Subject(), Headers: req.Headers(), Body: req.Data()}
	}
	rev, err := h.admin.PushPolicy(ctx, b)
	if err != nil {
		respondError(req, err)
		return
	}
	if h.grantsWatched {
		for h.policyRev.Load() < rev && ctx.Err() == nil {
			time.Sleep(2 * time.Millisecond)
		}
	}
	names := slices.Sorted(maps.Keys(r.Modules))
	h.audited(ctx, req, api.TypePolicyPushed,
		api.AdminChange{Action: "policy.push", By: who, Revision: rev, Details: map[string]any{"modules": names}},
		api.PolicyPushResponse{Revision: rev, Modules: len(r.Modules), PushedBy: who})
}

// resetPolicy removes the pushed policy: every authorize worker, and this
// service's grants, return to the configured policy (the shipped one
// unless serve was given --policy). It answers the revision removed.
func (h *handlers) resetPolicy(req micro.Request) {
	var r struct {
		By string `json:"by,omitempty"`
	}
	who, ok := h.decodeAdmin(req, &r, func() string { return r.By }, "{}")
	if !ok {
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	b, _, err := h.admin.Policy(ctx) // the revision removed, for the record
	if err == nil {
		err = h.admin.DeletePolicy(ctx)
	}
	if err != nil {
		respondError(req, err)
		return
	}
	h.audited(ctx, req, api.TypePolicyReset,
		api.AdminChange{Action: "policy.reset", By: who, Revision: b.Revision},
		api.PolicyResetResponse{Removed: b.Revision, ResetBy: who})
}

// getPolicy answers the pushed policy.
func (h *handlers) getPolicy(req micro.Request) {
	var r struct{}
	if _, ok := h.decodeAdmin(req, &r, func() string { return "" }, "{}"); !ok {
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	b, ok, err := h.admin.Policy(ctx)
	if err != nil {
		respondError(req, err)
		return
	}
	if !ok {
		_ = req.RespondJSON(api.PolicyBundle{})
		return
	}
	_ = req.RespondJSON(api.PolicyBundle{Pushed: true, Revision: b.Revision, PushedAt: b.PushedAt, PushedBy: b.PushedBy,
		Modules: b.Modules, Data: b.Data})
}

// pushHooks compiles a tenant's hook set and makes it the tenant's.
func (h *handlers) pushHooks(req micro.Request) {
	var r api.HooksPushRequest
	who, ok := h.decodeAdmin(req, &r, func() string { return r.By }, `{"tenant_id":…, "doc":{"hooks":[…]}}`)
	if !ok {
		return
	}
	if err := subjects.CheckTenant(r.TenantID); err != nil {
		respondError(req, api.WrapError(err, api.InvalidParameters, api.EInvalidName, "%v", err))
		return
	}
	set, err := hooks.Parse(r.Doc, hooks.SourceTenant)
	if err != nil {
		respondError(req, err)
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	hs := kvstore.HookSet{Tenant: r.TenantID, Doc: r.Doc, PushedBy: who}
	if h.identify != nil {
		hs.Proof = &api.DecisionProof{Subject: req.Subject(), Headers: req.Headers(), Body: req.Data()}
	}
	rev, err := h.admin.PushHooks(ctx, hs)
	if err != nil {
		respondError(req, err)
		return
	}
	h.audited(ctx, req, api.TypeHooksPushed,
		api.AdminChange{Action: "hooks.push", By: who, Target: r.TenantID, Revision: rev, Details: map[string]any{"hooks": len(set.Specs)}},
		api.HooksPushResponse{TenantID: r.TenantID, Revision: rev, Hooks: len(set.Specs), PushedBy: who})
}

// listHooks answers the tenants' hook sets, by tenant.
func (h *handlers) listHooks(req micro.Request) {
	var r api.HooksRequest
	if _, ok := h.decodeAdmin(req, &r, func() string { return r.By }, `{} or {"tenant_id":…}`); !ok {
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	sets, err := h.admin.HookSets(ctx)
	if err != nil {
		respondError(req, err)
		return
	}
	out := api.HooksResponse{HookSets: []api.HookSet{}}
	for _, s := range sets {
		if r.TenantID == "" || s.Tenant == r.TenantID {
			out.HookSets = append(out.HookSets, api.HookSet{TenantID: s.Tenant, Revision: s.Revision, PushedAt: s.PushedAt,
				PushedBy: s.PushedBy, Doc: s.Doc})
		}
	}
	sort.Slice(out.HookSets, func(i, j int) bool { return out.HookSets[i].TenantID < out.HookSets[j].TenantID })
	_ = req.RespondJSON(out)
}

// deleteHooks removes a tenant's hook set.
func (h *handlers) deleteHooks(req micro.Request) {
	var r api.HooksRequest
	who, ok := h.decodeAdmin(req, &r, func() string { return r.By }, `{"tenant_id":…}`)
	if !ok {
		return
	}
	if err := subjects.CheckTenant(r.TenantID); err != nil {
		respondError(req, api.WrapError(err, api.InvalidParameters, api.EInvalidName, "%v", err))
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	if err := h.admin.DeleteHooks(ctx, r.TenantID); err != nil {
		respondError(req, err)
		return
	}
	h.audited(ctx, req, api.TypeHooksDeleted, api.AdminChange{Action: "hooks.delete", By: who, Target: r.TenantID},
		api.HooksRequest{TenantID: r.TenantID})
}

// revoke records a token's revocation: every verifier refuses it and the
// tokens derived from it, and the bus closes their connections.
func (h *handlers) revoke(req micro.Request) {
	var r api.RevokeRequest
	who, ok := h.decodeAdmin(req, &r, func() string { return r.By }, `{"jti":…, "until":"RFC 3339 time", "reason":…}`)
	if !ok {
		return
	}
	if r.JTI == "" || r.Until.IsZero() {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, `expected {"jti":…, "until":"RFC 3339 time", "reason":…}`))
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	if err := h.admin.Revoke(ctx, r.JTI, r.Until, r.Reason, who, h.proof(req)); err != nil {
		respondError(req, err)
		return
	}
	h.audited(ctx, req, api.TypeTokenRevoked,
		api.AdminChange{Action: "tokens.revoke", By: who, Target: r.JTI, Reason: r.Reason, Details: map[string]any{"until": r.Until.UTC()}},
		api.RevokeResponse{JTI: r.JTI, Until: r.Until.UTC(), RevokedBy: who})
}

// listBreakers answers every breaker's state.
func (h *handlers) listBreakers(req micro.Request) {
	var r struct{}
	if _, ok := h.decodeAdmin(req, &r, func() string { return "" }, "{}"); !ok {
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	bs, err := h.admin.Breakers(ctx)
	if err != nil {
		respondError(req, err)
		return
	}
	out := api.BreakersResponse{Breakers: []api.BreakerState{}}
	for _, b := range bs {
		out.Breakers = append(out.Breakers, breakerOut(b))
	}
	_ = req.RespondJSON(out)
}

func breakerOut(b kvstore.BreakerState) api.BreakerState {
	return api.BreakerState{Key: b.Key, State: b.State, Since: b.Since, Probes: b.Probes, Successes: b.Successes, Forced: b.Forced, By: b.By}
}

// setBreaker forces a breaker open or closed, or releases it; the
// breaker's transition event (ai.agent.circuit.*) records who set it.
func (h *handlers) setBreaker(req micro.Request) {
	var r api.BreakerSetRequest
	who, ok := h.decodeAdmin(req, &r, func() string { return r.By }, `{"key":…, "state":"open"|"closed"|""}`)
	if !ok {
		return
	}
	if r.Key == "" || (r.State != api.BreakerOpen && r.State != api.BreakerClosed && r.State != api.BreakerRelease) {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid,
			`expected {"key":…, "state":"open"|"closed"|""} ("" releases a forced breaker)`))
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	st, err := breaker.ForceSigned(ctx, h.admin, h.publish, r.Key, r.State, who, h.proof(req))
	if err != nil {
		respondError(req, err)
		return
	}
	_ = req.RespondJSON(breakerOut(st))
}

// registerModel checks a model document and registers (or replaces) it.
func (h *handlers) registerModel(req micro.Request) {
	var r api.ModelRequest
	who, ok := h.decodeAdmin(req, &r, func() string { return r.By }, `{"model":{…}}`)
	if !ok {
		return
	}
	if _, err := modelrouter.Decode(r.Model); err != nil {
		respondError(req, asInvalid(err, api.EInvalidManifest, "model document: %v"))
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	m, err := h.admin.PutSignedModel(ctx, r.Model, who, h.proof(req))
	if err != nil {
		respondError(req, err)
		return
	}
	h.audited(ctx, req, api.TypeModelRegistered,
		api.AdminChange{Action: "models.register", By: who, Target: m.Name, Details: map[string]any{"api": m.API, "tier": m.Tier}}, m)
}

// asInvalid keeps an api.Error and makes any other error an invalid
// request with code.
func asInvalid(err error, code, format string) error {
	var te *api.Error
	if errors.As(err, &te) {
		return err
	}
	return api.WrapError(err, api.InvalidParameters, code, format, err)
}

// listModels answers the catalogue.
func (h *handlers) listModels(req micro.Request) {
	var r struct{}
	if _, ok := h.decodeAdmin(req, &r, func() string { return "" }, "{}"); !ok {
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	ms, err := h.admin.Models(ctx)
	if err != nil {
		respondError(req, err)
		return
	}
	out := api.ModelsResponse{Models: []json.RawMessage{}}
	for _, m := range ms {
		b, err := json.Marshal(m)
		if err != nil {
			respondError(req, err)
			return
		}
		out.Models = append(out.Models, b)
	}
	_ = req.RespondJSON(out)
}

// deleteModel removes a model from the catalogue; an unknown name gets
// E3850.
func (h *handlers) deleteModel(req micro.Request) {
	var r api.ModelRequest
	who, ok := h.decodeAdmin(req, &r, func() string { return r.By }, `{"name":…}`)
	if !ok {
		return
	}
	if r.Name == "" {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, `expected {"name":…}`))
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	err := h.admin.DeleteModel(ctx, r.Name)
	if errors.Is(err, kvstore.ErrModelNotFound) {
		err = api.NewError(api.InvalidParameters, api.EModelUnknown, "no model %q in the catalogue", r.Name)
	}
	if err != nil {
		respondError(req, err)
		return
	}
	h.audited(ctx, req, api.TypeModelDeleted, api.AdminChange{Action: "models.delete", By: who, Target: r.Name},
		api.ModelRequest{Name: r.Name})
}

// routingPolicy replaces the model routing policy, or restores the shipped
// one.
func (h *handlers) routingPolicy(req micro.Request) {
	var r api.RoutingPolicyRequest
	who, ok := h.decodeAdmin(req, &r, func() string { return r.By }, `{"rego":"…"} or {"reset":true}`)
	if !ok {
		return
	}
	if r.Reset == (r.Rego != "") {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, `expected {"rego":"…"} or {"reset":true}`))
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	if !r.Reset {
		if _, err := modelrouter.NewRegoRanker(ctx, r.Rego); err != nil {
			respondError(req, asInvalid(err, api.EPolicyFailed, "routing policy does not compile: %v"))
			return
		}
	}
	if err := h.admin.PutSignedRoutingPolicy(ctx, []byte(r.Rego), who, h.proof(req)); err != nil {
		respondError(req, err)
		return
	}
	h.audited(ctx, req, api.TypeRoutingPolicyPushed,
		api.AdminChange{Action: "models.policy", By: who, Details: map[string]any{"reset": r.Reset}},
		api.RoutingPolicyRequest{Reset: r.Reset})
}

// watchGrants keeps the capability grant rule the service evaluates in
// step with the pushed policy: a pushed bundle's rule (the shipped one when
// it defines none), the configured one when the bundle is removed. A
// bundle whose rule does not compile leaves the current one (the push
// endpoint refuses such bundles; only a direct bucket write can store one).
func (h *handlers) watchGrants(ctx context.Context) error {
	configured := h.disc.Grants
	h.grants.Store(configured)
	h.grantsWatched = true
	var order signedstate.Order
	return h.admin.WatchPolicy(ctx, func(b kvstore.PolicyBundle, ok bool, err error) {
		if !ok {
			order.Removed("policy")
		}
		if ok && err == nil && h.stateProof != nil {
			if err := order.Policy(b, h.stateProof); err != nil {
				h.refusedState(ctx, "policy", b.Revision, err)
				return
			}
		}
		switch {
		case !ok:
			h.grants.Store(configured)
		case err == nil:
			if g, gerr := policy.NewGrants(ctx, b.Modules, b.Data); gerr == nil {
				h.grants.Store(g)
			}
		}
		if ok && b.Revision > h.policyRev.Load() {
			h.policyRev.Store(b.Revision)
		}
	})
}

// refusedState logs and audits a record the service ignored.
func (h *handlers) refusedState(ctx context.Context, what string, rev uint64, cause error) {
	slog.Error("ignoring unsigned state: no operator's signature covers it", "what", what, "revision", rev, "err", cause)
	o, err := signedstate.RefusedEvent("urn:toolgate:control", what, rev, cause)
	if err == nil {
		err = h.publish(ctx, o)
	}
	if err != nil {
		slog.Error("auditing ignored state", "what", what, "revision", rev, "err", err)
	}
}

// grantRule is the capability grant rule in force, or nil.
func (h *handlers) grantRule() *policy.Grants {
	if g := h.grants.Load(); g != nil {
		return g
	}
	return h.disc.Grants
}
