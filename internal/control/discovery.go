package control

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/discovery"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// Discovery configures search by token and capability grants. Without a
// verifier, requests naming a token are refused (E3201); without a signer
// or grant policy, capability requests are matched but never granted.
type Discovery struct {
	Tokens *token.Verifier
	Signer *token.SigningKey
	Grants *policy.Grants
	// MaxLifetime bounds a granted token's lifetime (the verifiers' limit).
	MaxLifetime time.Duration
}

// WithDiscovery sets what searching by token and granting capabilities need.
func WithDiscovery(d Discovery) Option { return func(h *handlers) { h.disc = d } }

// statsMaxAge is how old the merged usage statistics ranking reads may be.
const statsMaxAge = time.Second

// statsCache holds the merged usage statistics for ranking, read again when
// older than statsMaxAge.
type statsCache struct {
	mu   sync.Mutex
	at   time.Time
	data map[string]kvstore.ToolShard
}

func (h *handlers) stats(ctx context.Context) map[string]kvstore.ToolShard {
	c := &h.statsCache
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.data != nil && time.Since(c.at) < statsMaxAge {
		return c.data
	}
	d, err := h.store.ToolStats(ctx)
	if err != nil {
		return c.data // ranking without fresh statistics beats no answer
	}
	c.data, c.at = d, time.Now()
	return d
}

func rankStats(all map[string]kvstore.ToolShard) func(string) (discovery.Stats, bool) {
	return func(id string) (discovery.Stats, bool) {
		s, ok := all[id]
		if !ok {
			return discovery.Stats{}, false
		}
		sum := s.Summary(id)
		return discovery.Stats{Calls: sum.Calls, Successes: sum.Successes, P50MS: sum.P50MS, AvgCost: sum.AvgCost}, true
	}
}

// tokenFilter verifies raw for tenant ("" for any) and returns what it may
// call.
func (h *handlers) tokenFilter(raw, tenant string) (*token.Claims, func(*tools.Manifest) bool, error) {
	if h.disc.Tokens == nil {
		return nil, nil, api.NewError(api.PermissionDenied, api.ETokenInvalid, "this deployment verifies no capability tokens")
	}
	c, err := h.disc.Tokens.Verify(raw)
	if err != nil {
		return nil, nil, err
	}
	if tenant != "" && c.TenantID != tenant {
		return nil, nil, api.NewError(api.PermissionDenied, api.ENotGranted,
			"the capability token is for tenant %q, not %q", c.TenantID, tenant)
	}
	return c, func(m *tools.Manifest) bool {
		return c.ToolID.Match(m.ID) && !discovery.HasSideEffect(m.Safety.SideEffects, c.ExcludedSideEffects)
	}, nil
}

// search answers tools.list: filters, search, ranking and a page.
func (h *handlers) search(req micro.Request, tenant string) {
	var r api.ListRequest
	if len(req.Data()) > 0 {
		if err := decode(req.Data(), &r); err != nil {
			respondError(req, api.WrapError(err, api.InvalidParameters, api.ERequestInvalid, "bad list request: %v", err))
			return
		}
	}
	if err := discovery.CheckRequest(r); err != nil {
		respondError(req, err)
		return
	}
	f := discovery.Filter{Category: r.Category, Tag: r.Tag, RiskLevelMax: r.RiskLevelMax,
		ExcludeSideEffects: r.ExcludeSideEffects, SourceTypes: r.SourceTypes, EnabledOnly: r.EnabledOnly}
	if r.CapabilityToken != "" {
		_, allowed, err := h.tokenFilter(r.CapabilityToken, tenant)
		if err != nil {
			respondError(req, err)
			return
		}
		f.Allowed = allowed
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	now := time.Now()
	listed := h.reg.List()
	if r.All {
		listed = h.reg.ListAll()
	}
	found := discovery.Search(listed, discovery.Request{Query: r.Query, Capabilities: r.Capabilities, Filter: f},
		rankStats(h.stats(ctx)), now)
	if r.Query == "" && len(r.Capabilities) == 0 {
		// Nothing to rank by relevance: the listing is by id, as ever.
		slices.SortFunc(found, func(a, b discovery.Ranked) int { return cmp.Compare(a.Manifest.ID, b.Manifest.ID) })
	}
	page, next, size, err := discovery.Page(r, found)
	if err != nil {
		respondError(req, err)
		return
	}
	out := api.ListResponse{Tools: []api.ToolSummary{}, TotalCount: len(found), PageSize: size, NextCursor: next}
	for _, p := range page {
		m := p.Manifest
		s := api.ToolSummary{ToolID: m.ID, ToolName: m.Name, Description: m.Description, Category: m.Category,
			Kind: m.Kind, LatestVersion: m.Version, Tags: m.Tags, RiskLevel: m.Safety.RiskLevel,
			RequiresApproval: m.Safety.RequiresApproval, Capabilities: m.Capabilities,
			SideEffects: m.Safety.SideEffects, State: m.State(now)}
		if r.Query != "" || len(r.Capabilities) > 0 {
			t := p.Terms
			s.Score, s.Terms = p.Score, &t
		}
		for _, v := range h.reg.Versions(m.ID) {
			s.Versions = append(s.Versions, v.Version)
		}
		out.Tools = append(out.Tools, s)
	}
	_ = req.RespondJSON(out)
}

// toolStats answers tools.stats: usage statistics of one tool or all.
func (h *handlers) toolStats(req micro.Request) {
	var r api.StatsRequest
	if len(req.Data()) > 0 {
		if err := decode(req.Data(), &r); err != nil {
			respondError(req, api.WrapError(err, api.InvalidParameters, api.ERequestInvalid, "expected {\"tool_id\":…}: %v", err))
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	all, err := h.store.ToolStats(ctx)
	if err != nil {
		respondError(req, err)
		return
	}
	out := api.StatsResponse{Tools: []api.ToolStats{}}
	for id, s := range all {
		if r.ToolID == "" || r.ToolID == id {
			out.Tools = append(out.Tools, s.Summary(id))
		}
	}
	slices.SortFunc(out.Tools, func(a, b api.ToolStats) int { return cmp.Compare(a.ToolID, b.ToolID) })
	_ = req.RespondJSON(out)
}

// capabilityRequest answers tool.svc.<tenant>.capability.request: it
// validates the request (E3040), matches registered tools within its
// constraints (E3043 when none), and, when the request carries the agent's
// token and the grant policy allows it, mints a child token for exactly the
// granted tools (E3044 when policy grants none). The request, its match and
// its grant are audited and recorded for the run report.
func (h *handlers) capabilityRequest(tenant string, req micro.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Now().UTC()
	r, err := discovery.ParseCapabilityRequest(req.Data())
	if err != nil {
		h.refuseCapability(ctx, req, tenant, api.CapabilityRequest{}, err)
		return
	}
	r.RequestID = cmp.Or(r.RequestID, uuid.NewString())
	var parent *token.Claims
	var allowed func(*tools.Manifest) bool
	if r.CapabilityToken != "" {
		if parent, allowed, err = h.tokenFilter(r.CapabilityToken, tenant); err != nil {
			h.refuseCapability(ctx, req, tenant, r, err)
			return
		}
	}
	stats := h.stats(ctx)
	expected := func(id string) float64 {
		if s, ok := stats[id]; ok && s.Calls > 0 {
			return s.Percentile(0.95)
		}
		return 0
	}
	match := discovery.MatchCapability(h.reg.List(), r, allowed, rankStats(stats), expected, now)
	resp := api.CapabilityResponse{RequestID: r.RequestID, Outcome: api.CapabilityMatched,
		Candidates: []api.CapabilityCandidate{}, Considered: match.Considered}
	for _, c := range match.Candidates {
		t := c.Terms
		resp.Candidates = append(resp.Candidates, api.CapabilityCandidate{ToolID: c.Manifest.ID, Version: c.Manifest.Version, Score: c.Score, Terms: &t})
	}
	switch {
	case len(match.Candidates) == 0:
		resp.Outcome = api.CapabilityRefused
		resp.Refusal = api.NewError(api.ToolNotFound, api.ECapabilityNoMatch,
			"no registered tool offers %q within the constraints", r.Capability)
	case parent != nil && h.disc.Signer != nil && h.grantRule() != nil:
		resp.Grant, resp.Refusal, err = h.grant(ctx, tenant, r, match.Candidates, parent, now)
		if err != nil {
			respondError(req, err)
			return
		}
		if resp.Grant != nil {
			resp.Outcome = api.CapabilityGranted
		}
	}
	if len(resp.Considered) == 0 {
		resp.Considered = nil
	}
	stored := r
	stored.CapabilityToken = ""
	rep := api.CapabilityReport{RequestID: r.RequestID, Tenant: tenant, RequestedAt: now,
		RequestedBy: callerOf(req), Request: stored, Response: resp}
	if rep.RequestedBy == "" && parent != nil {
		rep.RequestedBy = parent.AgentDID
	}
	noToken := rep
	if noToken.Response.Grant != nil {
		g := *noToken.Response.Grant
		g.Token = "" // the report and the audit trail never hold the token itself
		noToken.Response.Grant = &g
	}
	if err := h.store.SaveCapability(ctx, noToken); err != nil {
		h.refuseCapability(ctx, req, tenant, r, err)
		return
	}
	if err := h.auditCapability(ctx, tenant, noToken); err != nil {
		respondError(req, err)
		return
	}
	_ = req.RespondJSON(resp)
}

// refuseCapability answers a capability request toolgate could not take
// (malformed, a token that does not verify, a reused id) with err, and
// audits it as requested and refused: what could be read of the request
// (never its token) and the error. These events have ids of their own, so
// a reused request id is audited too.
func (h *handlers) refuseCapability(ctx context.Context, req micro.Request, tenant string, r api.CapabilityRequest, err error) {
	r.CapabilityToken = ""
	te := api.AsError(err)
	rep := api.CapabilityReport{RequestID: r.RequestID, Tenant: tenant, RequestedAt: time.Now().UTC(), RequestedBy: callerOf(req),
		Request: r, Response: api.CapabilityResponse{RequestID: r.RequestID, Outcome: api.CapabilityRefused, Refusal: te}}
	if aerr := h.publishCapability(ctx, tenant, uuid.NewString(), rep); aerr != nil {
		respondError(req, aerr) // an unaudited refusal is not answered as if it were
		return
	}
	respondError(req, err)
}

// grant asks the policy and mints the child token; a refusal is the second
// result, an error the third.
func (h *handlers) grant(ctx context.Context, tenant string, r api.CapabilityRequest, cands []discovery.Ranked,
	parent *token.Claims, now time.Time) (*api.CapabilityGrant, *api.Error, error) {
	g, err := h.grantRule().Eval(ctx, discovery.GrantInput(tenant, r, cands, parent, now))
	if err != nil {
		return nil, nil, err
	}
	if !g.Allow {
		return nil, api.NewError(api.PermissionDenied, api.ECapabilityNotGranted,
			"the capability policy grants no token: %v", g.Reasons).WithDetail("reasons", g.Reasons), nil
	}
	c, err := discovery.ChildClaims(parent, r, g, cands, now)
	if err != nil {
		var te *api.Error
		if errors.As(err, &te) {
			return nil, te, nil
		}
		return nil, nil, err
	}
	c.ID = uuid.NewString()
	raw, err := token.MintWithin(h.disc.Signer, c, h.disc.MaxLifetime)
	if err != nil {
		return nil, nil, err
	}
	out := &api.CapabilityGrant{Token: raw, TokenID: c.ID, Tools: c.ToolID, ExpiresAt: c.ExpiresAt.UTC()}
	if c.Budget != nil {
		out.MaxCalls, out.MaxRuntimeMS, out.MaxCost = c.Budget.MaxCalls, c.Budget.MaxRuntimeMS, c.Budget.MaxCost
	}
	return out, nil, nil
}

// auditCapability appends the request and its outcome to the audit stream.
func (h *handlers) auditCapability(ctx context.Context, tenant string, rep api.CapabilityReport) error {
	return h.publishCapability(ctx, tenant, rep.RequestID, rep)
}

// publishCapability publishes the requested and outcome events of rep with
// ids derived from id.
func (h *handlers) publishCapability(ctx context.Context, tenant, id string, rep api.CapabilityReport) error {
	outcome := map[string]string{api.CapabilityGranted: api.TypeCapabilityGranted,
		api.CapabilityMatched: api.TypeCapabilityMatched, api.CapabilityRefused: api.TypeCapabilityRefused}[rep.Response.Outcome]
	for _, ev := range []struct {
		typ  string
		data any
	}{
		{api.TypeCapabilityRequested, map[string]any{"request_id": rep.RequestID, "tenant": tenant,
			"requested_by": rep.RequestedBy, "request": rep.Request}},
		{outcome, map[string]any{"request_id": rep.RequestID, "tenant": tenant, "response": rep.Response}},
	} {
		e := event.New()
		e.SetID(id + "." + envelope.SubjectSuffix(ev.typ))
		e.SetSource("urn:toolgate:control")
		e.SetType(ev.typ)
		e.SetSubject(cmp.Or(rep.RequestID, id))
		e.SetTime(rep.RequestedAt)
		if err := e.SetData(event.ApplicationJSON, ev.data); err != nil {
			return err
		}
		o, err := stages.EventOutput(subjects.AuditEvent(tenant, envelope.SubjectSuffix(ev.typ)), &e)
		if err != nil {
			return err
		}
		if err := runner.Publish(ctx, h.js, o); err != nil {
			return err
		}
	}
	return nil
}

// capabilityReport answers the run report of a capability request: the
// request, its answer, and what the granted token's calls used so far.
func (h *handlers) capabilityReport(tenant string, req micro.Request) {
	var r struct {
		TenantID  string `json:"tenant_id"`
		RequestID string `json:"request_id"`
	}
	if err := decode(req.Data(), &r); err != nil || r.RequestID == "" {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, `expected {"request_id":…}`))
		return
	}
	if tenant != "" && !sameTenant(req, tenant, &r.TenantID) {
		return
	}
	if err := checkNames(r.TenantID, r.RequestID); err != nil {
		respondError(req, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rep, err := h.store.Capability(ctx, r.TenantID, r.RequestID)
	if err != nil {
		respondError(req, err)
		return
	}
	if g := rep.Response.Grant; g != nil {
		u, err := h.store.Usage(ctx, r.TenantID, token.BudgetKey(g.TokenID))
		if err != nil {
			respondError(req, err)
			return
		}
		rep.Used = &api.CapabilityUsage{Calls: u.Made(), RuntimeMS: u.RuntimeMS, Cost: u.Cost, Tokens: u.Tokens,
			ConsecutiveFailures: u.ConsecutiveFailures}
	}
	_ = req.RespondJSON(rep)
}
