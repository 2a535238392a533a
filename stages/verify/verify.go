// Package verify is the fifth stage: it holds a tool's result to the tool's
// output schema and to the output policy (size, secrets, personal data,
// injected instructions, injection payloads) before anything reaches the caller.
package verify

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/stages/detect"
	"github.com/toolgate/toolgate/stages/invocation"
	"github.com/toolgate/toolgate/stages/toolerr"
	"github.com/toolgate/toolgate/stages/tools"
	"github.com/toolgate/toolgate/subjects"
)

// Actions on a detector's findings, from the mildest to the strictest.
const (
	ActionFlag   = "flag"
	ActionEscape = "escape"
	ActionRedact = "redact"
	ActionReject = "reject"
)

var strictness = map[string]int{ActionFlag: 0, ActionEscape: 1, ActionRedact: 2, ActionReject: 3}

// DefaultActions apply where neither the manifest nor the tenant says otherwise.
var DefaultActions = map[detect.Detector]string{
	detect.Secrets:          ActionRedact,
	detect.PII:              ActionRedact,
	detect.PromptInjection:  ActionReject,
	detect.SQLInjection:     ActionFlag,
	detect.CommandInjection: ActionFlag,
	detect.XSS:              ActionEscape,
}

// DefaultMaxResultBytes bounds results whose manifest sets no limit.
const DefaultMaxResultBytes = 1 << 20

var rejectCodes = map[detect.Detector]string{
	detect.Secrets:          toolerr.EOutputSecret,
	detect.PII:              toolerr.EOutputPII,
	detect.PromptInjection:  toolerr.EOutputInjection,
	detect.SQLInjection:     toolerr.EOutputSQL,
	detect.CommandInjection: toolerr.EOutputCommand,
	detect.XSS:              toolerr.EOutputXSS,
}

// Config configures the verify stage.
type Config struct {
	// Detectors scans results; nil uses the shipped rules.
	Detectors *detect.Engine
	// Tenants maps a tenant to detector actions. Where a tenant and the
	// manifest disagree, the stricter action wins.
	Tenants map[string]map[string]string
}

// Verifier implements the verify stage.
type Verifier struct {
	reg *tools.Registry
	cfg Config
}

var _ stages.Stage = (*Verifier)(nil)

// New returns a Verifier reading output schemas and policies from reg.
func New(reg *tools.Registry, cfg Config) *Verifier {
	if cfg.Detectors == nil {
		cfg.Detectors = detect.Default()
	}
	return &Verifier{reg: reg, cfg: cfg}
}

// Process implements stages.Stage. A rejected result is dropped: the caller
// gets the reason, never the unverified output.
func (v *Verifier) Process(_ context.Context, inv *invocation.Invocation) ([]stages.Output, error) {
	m, err := v.reg.Resolve(inv.Route.ToolID, inv.Route.ToolVersion)
	if err != nil {
		return nil, err
	}
	pol := tools.OutputPolicy{}
	if m.OutputPolicy != nil {
		pol = *m.OutputPolicy
	}
	result, err := v.check(m, pol, inv)
	if err != nil {
		inv.Result = nil
		return nil, err
	}
	inv.Succeed(subjects.Verify, result)
	return nil, nil
}

func (v *Verifier) check(m *tools.Manifest, pol tools.OutputPolicy, inv *invocation.Invocation) ([]byte, error) {
	result := inv.Result
	limit := pol.MaxBytes
	if limit <= 0 {
		limit = DefaultMaxResultBytes
	}
	if len(result) > limit {
		return nil, toolerr.New(toolerr.ToolExecutionError, toolerr.EOutputTooLarge,
			"%s returned %d bytes, the limit is %d", m.Key(), len(result), limit)
	}
	if pol.Coerce && len(m.OutputSchema) > 0 {
		if c, changed := coerce(result, m.OutputSchema); changed {
			result = c
			inv.Metadata.Warnings = append(inv.Metadata.Warnings, "result values coerced to the output schema's types")
		}
	}
	fields, err := m.ValidateOutput(result)
	if err != nil {
		return nil, toolerr.Wrap(err, toolerr.ToolExecutionError, toolerr.EResultNotJSON,
			"%s returned a result that is not JSON", m.Key())
	}
	if len(fields) > 0 {
		if pol.Mode != "lenient" {
			return nil, toolerr.New(toolerr.ToolExecutionError, toolerr.EResultSchema,
				"%s returned a result that does not match its output schema", m.Key()).WithFields(fields)
		}
		inv.Metadata.Warnings = append(inv.Metadata.Warnings,
			fmt.Sprintf("%s: result does not match the output schema (lenient): %s %s", toolerr.EResultSchema, fields[0].Location, fields[0].Message))
	}
	return v.sanitize(m, pol, inv, result)
}

// sanitize applies each detector's action, strictest first.
func (v *Verifier) sanitize(m *tools.Manifest, pol tools.OutputPolicy, inv *invocation.Invocation, result []byte) ([]byte, error) {
	actions := v.actions(pol, inv.Tenant)
	ds := make([]detect.Detector, 0, len(actions))
	for d := range actions {
		ds = append(ds, d)
	}
	sort.Slice(ds, func(i, j int) bool {
		if a, b := strictness[actions[ds[i]]], strictness[actions[ds[j]]]; a != b {
			return a > b
		}
		return ds[i] < ds[j]
	})
	eng := v.cfg.Detectors
	for _, d := range ds {
		var found []detect.Finding
		var err error
		switch actions[d] {
		case ActionReject:
			if found, err = eng.ScanJSON(result, d); err == nil && len(found) > 0 {
				f := found[0]
				inv.Findings = append(inv.Findings, record(found, ActionReject, eng.Version())...)
				return nil, toolerr.New(toolerr.ToolExecutionError, rejectCodes[d],
					"%s returned %s (rule %s at %s)", m.Key(), strings.ReplaceAll(string(d), "_", " "), f.Rule, pointer(f.Path)).
					WithDetail("rule", f.Rule).WithDetail("detector", d).WithDetail("rules_version", eng.Version())
			}
		case ActionRedact:
			result, found, err = eng.RedactJSON(result, d)
		case ActionEscape:
			result, found, err = eng.EscapeJSON(result, d)
		default:
			found, err = eng.ScanJSON(result, d)
		}
		if err != nil {
			return nil, toolerr.Wrap(err, toolerr.ToolExecutionError, toolerr.EResultNotJSON, "scanning the result: %v", err)
		}
		if len(found) > 0 {
			inv.Findings = append(inv.Findings, record(found, actions[d], eng.Version())...)
			inv.Metadata.Warnings = append(inv.Metadata.Warnings,
				fmt.Sprintf("%d %s finding(s) in the result: %s", len(found), strings.ReplaceAll(string(d), "_", " "), pastTense(actions[d])))
		}
	}
	return result, nil
}

// actions merges the defaults, the manifest's actions and the tenant's:
// the manifest may relax a default, the tenant may only tighten.
func (v *Verifier) actions(pol tools.OutputPolicy, tenant string) map[detect.Detector]string {
	out := make(map[detect.Detector]string, len(DefaultActions))
	for d, a := range DefaultActions {
		out[d] = a
	}
	for d, a := range pol.Actions {
		out[detect.Detector(d)] = a
	}
	for d, a := range v.cfg.Tenants[tenant] {
		if cur, ok := out[detect.Detector(d)]; !ok || strictness[a] > strictness[cur] {
			out[detect.Detector(d)] = a
		}
	}
	return out
}

func record(fs []detect.Finding, action, version string) []invocation.Finding {
	out := make([]invocation.Finding, 0, len(fs))
	for _, f := range fs {
		out = append(out, invocation.Finding{Rule: f.Rule, Detector: string(f.Detector), Path: f.Path, Action: action, RulesVersion: version})
	}
	return out
}

func pointer(p string) string {
	if p == "" {
		return "/"
	}
	return p
}

func pastTense(action string) string {
	switch action {
	case ActionRedact:
		return "redacted"
	case ActionEscape:
		return "escaped"
	}
	return "flagged"
}
