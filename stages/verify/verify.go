// Package verify is the fifth stage: it holds a tool's result to the tool's
// output schema before anything reaches the caller.
package verify

import (
	"context"

	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/stages/invocation"
	"github.com/toolgate/toolgate/stages/toolerr"
	"github.com/toolgate/toolgate/stages/tools"
	"github.com/toolgate/toolgate/subjects"
)

// Verifier implements the verify stage.
type Verifier struct{ reg *tools.Registry }

var _ stages.Stage = (*Verifier)(nil)

// New returns a Verifier reading output schemas from reg.
func New(reg *tools.Registry) *Verifier { return &Verifier{reg: reg} }

// Process implements stages.Stage. A result that fails the schema is dropped:
// the caller gets the field-level errors, never unverified output.
func (v *Verifier) Process(_ context.Context, inv *invocation.Invocation) ([]stages.Output, error) {
	m, err := v.reg.Resolve(inv.Route.ToolID, inv.Route.ToolVersion)
	if err != nil {
		return nil, err
	}
	fields, err := m.ValidateOutput(inv.Result)
	if err != nil {
		inv.Result = nil
		return nil, toolerr.Wrap(err, toolerr.ToolExecutionError, toolerr.EResultNotJSON,
			"%s returned a result that is not JSON", m.Key())
	}
	if len(fields) > 0 {
		inv.Result = nil
		return nil, toolerr.New(toolerr.ToolExecutionError, toolerr.EResultSchema,
			"%s returned a result that does not match its output schema", m.Key()).WithFields(fields)
	}
	inv.Succeed(subjects.Verify, inv.Result)
	return nil, nil
}
