// Package execute is the fourth stage: it runs the tool the route stage
// chose, within its time limit, and records how it went.
package execute

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/timeout"

	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/stages/execute/builtin"
	"github.com/toolgate/toolgate/stages/invocation"
	"github.com/toolgate/toolgate/stages/toolerr"
	"github.com/toolgate/toolgate/stages/tools"
	"github.com/toolgate/toolgate/subjects"
)

// Kinds lists the tool kinds this executor runs.
var Kinds = []string{"builtin"}

// Executor implements the execute stage.
type Executor struct {
	reg      *tools.Registry
	builtins builtin.Set
	store    *kvstore.Store
}

var _ stages.Stage = (*Executor)(nil)

// New returns an Executor running builtins. It records each invocation as
// running in store before the tool starts.
func New(reg *tools.Registry, builtins builtin.Set, store *kvstore.Store) *Executor {
	return &Executor{reg: reg, builtins: builtins, store: store}
}

// Process implements stages.Stage. The result is left for verify; only a
// failure ends the invocation here.
func (x *Executor) Process(ctx context.Context, inv *invocation.Invocation) ([]stages.Output, error) {
	m, err := x.reg.Resolve(inv.Route.ToolID, inv.Route.ToolVersion)
	if err != nil {
		return nil, err
	}
	if m.Kind != "builtin" || m.Builtin == nil {
		return nil, toolerr.New(toolerr.ToolExecutionError, toolerr.EExecutorUnavailable,
			"no executor for %s tools", m.Kind)
	}
	fn, ok := x.builtins[m.Builtin.Function]
	if !ok {
		return nil, toolerr.New(toolerr.ToolExecutionError, toolerr.EExecutorUnavailable,
			"builtin function %q is not in this binary", m.Builtin.Function)
	}
	// Claim the invocation: a redelivery of one that already ended must not
	// run the tool again.
	rec, _, err := x.store.SetStatus(ctx, kvstore.Record{InvocationID: inv.ID, Tenant: inv.Tenant,
		Status: invocation.StatusRunning, ToolID: m.ID, ToolVersion: m.Version, Seq: inv.Event.Seq})
	if err != nil {
		return nil, stages.Transient(fmt.Errorf("recording running status: %w", err), 0)
	}
	if rec.Status.Terminal() {
		inv.Status, inv.Error, inv.EndedBy = rec.Status, rec.Error, subjects.Execute
		if rec.Response != nil {
			inv.Result = rec.Response.Result
		}
		return nil, nil
	}
	inv.Status = invocation.StatusRunning
	invoked, err := stages.AuditEvent(subjects.Execute, inv, invocation.TypeInvoked, inv.Audit())
	if err != nil {
		return nil, err
	}
	limit := Limit(m, inv.Request)
	start := time.Now()
	result, err := failsafe.With(timeout.New[json.RawMessage](limit)).WithContext(ctx).
		GetWithExecution(func(exec failsafe.Execution[json.RawMessage]) (json.RawMessage, error) {
			return call(exec.Context(), fn, inv.Request.Parameters)
		})
	end := time.Now()
	inv.Metadata.StartedAt = start.UTC().Format(time.RFC3339Nano)
	inv.Metadata.CompletedAt = end.UTC().Format(time.RFC3339Nano)
	inv.Metadata.DurationMS = end.Sub(start).Milliseconds()
	outs := []stages.Output{invoked}
	if err != nil {
		return outs, classify(err, m, limit)
	}
	if !json.Valid(result) {
		return outs, toolerr.New(toolerr.ToolExecutionError, toolerr.EResultNotJSON, "%s returned invalid JSON", m.Key())
	}
	inv.Result = result
	return outs, nil
}

// Limit is the time an invocation may run: the tool's limit, narrowed (never
// widened) by the request.
func Limit(m *tools.Manifest, req *invocation.Request) time.Duration {
	d := m.Timeout()
	if rl := req.ResourceLimits; rl != nil && rl.TimeoutSeconds > 0 {
		d = min(d, time.Duration(rl.TimeoutSeconds)*time.Second)
	}
	return d
}

// errPanic marks a builtin that panicked.
var errPanic = errors.New("tool panicked")

func call(ctx context.Context, fn builtin.Func, params json.RawMessage) (out json.RawMessage, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = nil, fmt.Errorf("%w: %v", errPanic, p)
		}
	}()
	return fn(ctx, params)
}

func classify(err error, m *tools.Manifest, limit time.Duration) error {
	switch {
	case errors.Is(err, timeout.ErrExceeded), errors.Is(err, context.DeadlineExceeded):
		return toolerr.New(toolerr.Timeout, toolerr.ETimeout, "%s exceeded its %v time limit", m.Key(), limit).AsRetryable()
	case errors.Is(err, errPanic):
		return toolerr.Wrap(err, toolerr.ToolExecutionError, toolerr.EToolPanicked, "%s failed unexpectedly", m.Key())
	}
	var te *toolerr.Error
	if errors.As(err, &te) {
		return te
	}
	return toolerr.Wrap(err, toolerr.ToolExecutionError, toolerr.EToolFailed, "%s: %v", m.Key(), err)
}
