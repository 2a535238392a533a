package control

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// handler serves one endpoint of subjects.ControlEndpoints: operator on
// its subject (operators and administrative endpoints), scoped on
// tool.svc.<tenant>.<endpoint> (tenant-scoped endpoints).
type handler struct {
	operator micro.HandlerFunc
	scoped   func(tenant string, req micro.Request)
}

// endpoints are the handlers of subjects.ControlEndpoints, by subject.
func (h *handlers) endpoints() map[string]handler {
	eps := map[string]handler{
		subjects.SvcStatus:  h.status().handler(),
		subjects.SvcReceipt: h.receipt().handler(),
		subjects.SvcCancel:  h.cancel().handler(),
		subjects.SvcToolsList: {
			operator: func(req micro.Request) { h.search(req, "") },
			scoped:   func(tenant string, req micro.Request) { h.search(req, tenant) },
		},
		subjects.SvcToolsGet: {
			operator: func(req micro.Request) { h.get(req, true) },
			scoped:   func(_ string, req micro.Request) { h.get(req, false) },
		},
		subjects.SvcBudget:            h.budget().handler(),
		subjects.SvcApprovalsList:     h.listApprovals().handler(),
		subjects.SvcApprovalsGet:      h.getApproval().handler(),
		subjects.SvcCapabilityRequest: {scoped: h.capabilityRequest},
		subjects.SvcCapabilityReport: {
			operator: func(req micro.Request) { h.capabilityReport("", req) },
			scoped:   h.capabilityReport,
		},
		subjects.SvcAuditHistory:  {scoped: h.tenantAuditHistory},
		subjects.SvcToolsRegister: {operator: h.register},
		subjects.SvcToolsDelete:   {operator: h.deleteTool},
		subjects.SvcToolsPurge:    {operator: h.purgeTool},
		subjects.SvcToolsStats:    {operator: h.toolStats},
		subjects.SvcModelsStats:   {operator: h.modelStats},
		subjects.SvcApproval:      {operator: h.decide},

		subjects.SvcCheckpointsList:   {scoped: h.tenantCheckpointsList},
		subjects.SvcCheckpointsGet:    {scoped: h.tenantCheckpointsGet},
		subjects.SvcCheckpointsDelete: {scoped: h.tenantCheckpointsDelete},

		subjects.SvcTokensKeys: {operator: h.tokenKeys, scoped: func(_ string, req micro.Request) { h.tokenKeys(req) }},
	}
	for _, admin := range []map[string]micro.HandlerFunc{h.adminEndpoints(), h.redriveEndpoints(), h.shadowEndpoints(), h.siteEndpoints()} {
		for subject, fn := range admin {
			eps[subject] = handler{operator: fn}
		}
	}
	return eps
}

// needsApprovals are the endpoints served only with an approval service.
var needsApprovals = map[string]bool{subjects.SvcApproval: true, subjects.SvcCancel: true}

// endpoint is one micro endpoint the service adds.
type endpoint struct {
	name, subject string
	fn            micro.HandlerFunc
}

// serving lists the micro endpoints of subjects.ControlEndpoints, each
// named after its subject (tool.svc.policy.push is policy-push; its
// tenant-scoped form tenant-tool-svc-status), or refuses an endpoint of
// the table without its handler.
func (h *handlers) serving(withApprovals bool) ([]endpoint, error) {
	eps := h.endpoints()
	var out []endpoint
	for _, ep := range subjects.ControlEndpoints {
		if needsApprovals[ep.Subject] && !withApprovals {
			continue
		}
		hd := eps[ep.Subject]
		if ep.Operator || ep.Admin {
			if hd.operator == nil {
				return nil, fmt.Errorf("control: no handler for the endpoint %s", ep.Subject)
			}
			out = append(out, endpoint{strings.ReplaceAll(strings.TrimPrefix(ep.Subject, "tool.svc."), ".", "-"), ep.Subject, hd.operator})
		}
		if ep.Tenant {
			if hd.scoped == nil {
				return nil, fmt.Errorf("control: no handler for the tenant endpoint %s", ep.Subject)
			}
			// Tenant-scoped endpoints, tool.svc.<tenant>.<endpoint>: the
			// ones the bus lets an agent call, for its own tenant only.
			out = append(out, endpoint{"tenant-" + strings.ReplaceAll(ep.Subject, ".", "-"), subjects.TenantSvc("*", ep.Subject), h.scoped(hd.scoped)})
		}
	}
	return out, nil
}

// request is the decode-check-respond shape of an endpoint served both to
// operators, who name the tenant in the body, and per tenant, where the
// subject names it and the body may name no other (E3014).
type request[T any] struct {
	// expected and scopedExpected are the bodies the two forms take, for
	// a refusal (E3005).
	expected, scopedExpected string
	// tenant is the body's tenant member.
	tenant func(*T) *string
	// complete reports whether the body has what both forms need, the
	// tenant aside.
	complete func(*T) bool
	// emptyScoped takes an empty body on the scoped form as {}.
	emptyScoped bool
	// caller, when set, records on the scoped form who asked: the caller
	// the server names (callerOf), never the body.
	caller func(r *T, who string)
	// do serves a checked request for a caller who sees what v sees
	// (everyone on the operators' form): its answer, or an error to answer.
	do func(r T, v viewer) (any, error)
}

func (r request[T]) handler() handler {
	return handler{operator: r.serveOperator, scoped: r.serveScoped}
}

func (r request[T]) serveOperator(req micro.Request) {
	var v T
	if err := decode(req.Data(), &v); err != nil || *r.tenant(&v) == "" || !r.complete(&v) {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, "expected %s", r.expected))
		return
	}
	respond(req)(r.do(v, everyone))
}

func (r request[T]) serveScoped(tenant string, req micro.Request) {
	var v T
	if !r.emptyScoped || len(req.Data()) > 0 {
		if err := decode(req.Data(), &v); err != nil || !r.complete(&v) {
			respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, "expected %s", r.scopedExpected))
			return
		}
	}
	if !sameTenant(req, tenant, r.tenant(&v)) {
		return
	}
	if r.caller != nil {
		if who := callerOf(req); who != "" {
			r.caller(&v, who)
		}
	}
	respond(req)(r.do(v, viewerOf(req)))
}

// respond answers req with v, or with err when there is one.
func respond(req micro.Request) func(v any, err error) {
	return func(v any, err error) {
		if err != nil {
			respondError(req, err)
			return
		}
		_ = req.RespondJSON(v)
	}
}
