// Package authorize is the second stage: it asks the policy engine whether
// the invocation may run. Anything but an explicit allow is a denial.
package authorize

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"time"

	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/stages/authorize/policy"
	"github.com/toolgate/toolgate/stages/invocation"
	"github.com/toolgate/toolgate/stages/toolerr"
	"github.com/toolgate/toolgate/stages/tools"
)

// Authorizer implements the authorize stage.
type Authorizer struct {
	reg    *tools.Registry
	engine atomic.Pointer[policy.Engine]
	now    func() time.Time
}

var _ stages.Stage = (*Authorizer)(nil)

// New returns an Authorizer evaluating engine.
func New(reg *tools.Registry, engine *policy.Engine) *Authorizer {
	a := &Authorizer{reg: reg, now: time.Now}
	a.engine.Store(engine)
	return a
}

// SetEngine replaces the policy for every later evaluation.
func (a *Authorizer) SetEngine(e *policy.Engine) { a.engine.Store(e) }

// Input is what the policy sees as `input`.
type Input struct {
	Request *invocation.Request `json:"request"`
	Tool    *tools.Manifest     `json:"tool"`
	Tenant  string              `json:"tenant"`
	Time    string              `json:"time"`
}

// Process implements stages.Stage.
func (a *Authorizer) Process(ctx context.Context, inv *invocation.Invocation) ([]stages.Output, error) {
	m, err := a.reg.Resolve(inv.Request.ToolID, inv.Request.ToolVersion)
	if err != nil {
		return nil, err
	}
	req := *inv.Request
	req.CapabilityToken = "" // a policy never needs the raw token
	input, err := plain(Input{Request: &req, Tool: m, Tenant: inv.Tenant, Time: a.now().UTC().Format(time.RFC3339)})
	if err != nil {
		return nil, toolerr.Wrap(err, toolerr.InternalError, toolerr.EPolicyFailed, "building policy input: %v", err)
	}
	d, err := a.engine.Load().Eval(ctx, input)
	if err != nil {
		return nil, err
	}
	if !d.Allow {
		e := toolerr.New(toolerr.PermissionDenied, toolerr.EPolicyDenied,
			"denied by policy: %s", strings.Join(d.Reasons, "; ")).WithDetail("reasons", d.Reasons)
		if d.RequiresApproval {
			e.WithDetail("requires_approval", true)
		}
		return nil, e
	}
	return nil, nil
}

// plain turns v into the map/slice/number form OPA reads fastest and that
// follows the JSON field names.
func plain(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	return out, json.Unmarshal(b, &out)
}
