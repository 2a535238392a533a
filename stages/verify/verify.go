// Package verify is the fifth stage: it holds a tool's result to the tool's
// output schema and to the output policy (size, secrets, personal data,
// injected instructions, injection payloads) before anything reaches the caller.
package verify

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/detect"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
	"slices"
	"strings"
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
	// Flagged, not withheld: install instructions fetched by an agent
	// pipe downloads to a shell too; a manifest may reject.
	detect.MaliciousCode: ActionFlag,
}

// DefaultMaxResultBytes bounds results whose manifest sets no limit.
const DefaultMaxResultBytes = 1 << 20

// MaxResultDepth bounds the nesting of a result's objects and arrays: each
// scan of a string carries its JSON pointer, so the cost of a result grows
// with the square of its depth; no tool's answer needs more.
const MaxResultDepth = 128

// nesting returns how deep doc's objects and arrays nest, at most, reading
// its bytes once (strings skipped).
func nesting(doc []byte) int {
	depth, most, inString := 0, 0, false
	for i := 0; i < len(doc); i++ {
		switch c := doc[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			depth++
			most = max(most, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return most
}

// DefaultMaxPayload is the NATS server's default max_payload.
const DefaultMaxPayload = 1 << 20

// envelopeHeadroom is kept free below MaxPayload for message headers and
// what the audit stage adds to the invocation.
const envelopeHeadroom = 8 << 10

// DefaultMaxFindings bounds the findings one invocation records.
const DefaultMaxFindings = 50

var rejectCodes = map[detect.Detector]string{
	detect.Secrets:          api.EOutputSecret,
	detect.PII:              api.EOutputPII,
	detect.PromptInjection:  api.EOutputInjection,
	detect.SQLInjection:     api.EOutputSQL,
	detect.CommandInjection: api.EOutputCommand,
	detect.XSS:              api.EOutputXSS,
	detect.MaliciousCode:    api.EOutputMaliciousCode,
}

// Config configures the verify stage.
type Config struct {
	// Detectors scans results; nil uses the shipped rules.
	Detectors *detect.Engine
	// Tenants maps a tenant to detector actions. Where a tenant and the
	// manifest disagree, the stricter action wins.
	Tenants map[string]map[string]string
	// MaxPayload is the largest message the server accepts (0:
	// DefaultMaxPayload). A verified invocation that would not fit ends
	// with EResultUnsendable here instead of failing to publish.
	MaxPayload int
	// MaxFindings bounds the findings one invocation records, for the
	// audit event (0: DefaultMaxFindings). Beyond it, one entry per rule
	// and action carries the count of the findings left out.
	MaxFindings int
	// Classifier, when set, judges results the prompt_injection rules
	// pass (off by default); see Classifier.
	Classifier Classifier
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
	if cfg.MaxPayload <= 0 {
		cfg.MaxPayload = DefaultMaxPayload
	}
	if cfg.MaxFindings <= 0 {
		cfg.MaxFindings = DefaultMaxFindings
	}
	return &Verifier{reg: reg, cfg: cfg}
}

// Process implements stages.Stage. A rejected result is dropped: the caller
// gets the reason, never the unverified output.
func (v *Verifier) Process(ctx context.Context, inv *envelope.Invocation) ([]stages.Output, error) {
	m, err := v.reg.Resolve(inv.Route.ToolID, inv.Route.ToolVersion)
	if err != nil {
		return nil, err
	}
	pol := tools.OutputPolicy{}
	if m.OutputPolicy != nil {
		pol = *m.OutputPolicy
	}
	result, err := v.check(ctx, m, pol, inv)
	if err != nil {
		inv.Result = nil
		return nil, err
	}
	inv.Succeed(subjects.Verify, result)
	if size, fits := v.fits(ctx, inv); !fits {
		inv.Result = nil
		return nil, api.NewError(api.ToolExecutionError, api.EResultUnsendable,
			"%s returned %d bytes: with its invocation that is %d bytes, over the message limit of %d",
			m.Key(), len(result), size, v.cfg.MaxPayload-envelopeHeadroom)
	}
	return nil, nil
}

// changeBound bounds what verify adds to an envelope besides the result and
// the findings: its stage's timing, the status and who ended the call.
const changeBound = 1 << 10

// fits reports whether inv, as verify hands it on, stays within the message
// limit, and the size it found. The envelope execute handed over, whose
// size the Runner reports, bounds all of it but what verify changed: the
// result, counted whole and as if every byte were escaped though it
// replaces execute's, the findings and the warnings. Only
// an envelope that bound does not clear is encoded to be sure.
func (v *Verifier) fits(ctx context.Context, inv *envelope.Invocation) (int, bool) {
	limit := v.cfg.MaxPayload - envelopeHeadroom
	if in := stages.InputSize(ctx); in > 0 {
		// Six bytes a byte: the longest escape encoding/json writes
		// (\u003c for <, also inside a raw result).
		bound := in + 6*len(inv.Result) + changeBound
		for _, f := range inv.Findings {
			bound += 6*(len(f.Rule)+len(f.Detector)+len(f.Path)+len(f.Action)+len(f.RulesVersion)) + 128
		}
		for _, w := range inv.Metadata.Warnings {
			bound += 6*len(w) + 8
		}
		if bound <= limit {
			return bound, true
		}
	}
	b, err := json.Marshal(inv)
	if err != nil {
		return 0, true // the Runner's encoding reports it
	}
	return len(b), len(b) <= limit
}

// canonical re-encodes a JSON document from its decoded value, so that what
// is checked is what is forwarded: of a duplicated member only the last
// value, the one every decoder here keeps, survives. Text that is not one
// JSON value is returned as it is (schema validation rejects it).
func canonical(doc []byte) []byte {
	b, _ := canonicalTree(doc)
	return b
}

// canonicalTree is canonical with the decoded value it encoded, nil when
// doc is not one JSON value: the detectors' tree of the bytes returned
// (a decoded value encoded and decoded again is itself), so they need
// not decode them again.
func canonicalTree(doc []byte) ([]byte, any) {
	if !json.Valid(doc) {
		return doc, nil
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var x any
	if err := dec.Decode(&x); err != nil {
		return doc, nil
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(x); err != nil {
		return doc, nil
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), x
}

func (v *Verifier) check(ctx context.Context, m *tools.Manifest, pol tools.OutputPolicy, inv *envelope.Invocation) ([]byte, error) {
	result := inv.Result
	limit := pol.MaxBytes
	if limit <= 0 {
		limit = DefaultMaxResultBytes
	}
	if len(result) > limit {
		return nil, api.NewError(api.ToolExecutionError, api.EOutputTooLarge,
			"%s returned %d bytes, the limit is %d", m.Key(), len(result), limit)
	}
	if d := nesting(result); d > MaxResultDepth {
		return nil, api.NewError(api.ToolExecutionError, api.EOutputTooDeep,
			"%s returned a result nested %d deep, the limit is %d", m.Key(), d, MaxResultDepth)
	}
	result, tree := canonicalTree(result)
	if pol.Coerce && len(m.OutputSchema) > 0 {
		if c, changed := coerce(result, m.OutputSchema); changed {
			result, tree = c, nil
			inv.Metadata.Warnings = append(inv.Metadata.Warnings, "result values coerced to the output schema's types")
		}
	}
	fields, err := m.ValidateOutput(result)
	if err != nil {
		return nil, api.WrapError(err, api.ToolExecutionError, api.EResultNotJSON,
			"%s returned a result that is not JSON", m.Key())
	}
	if len(fields) > 0 {
		if pol.Mode != "lenient" {
			return nil, api.NewError(api.ToolExecutionError, schemaECode(fields),
				"%s returned a result that does not match its output schema", m.Key()).WithFields(fields)
		}
		inv.Metadata.Warnings = append(inv.Metadata.Warnings,
			fmt.Sprintf("%s: result does not match the output schema (lenient): %s %s", api.EResultSchema, fields[0].Location, fields[0].Message))
	}
	doc := detect.NewDoc(result)
	if tree != nil {
		doc = detect.NewDecodedDoc(result, tree)
	}
	return v.sanitize(ctx, m, pol, inv, doc)
}

// CheckError holds the text of a failed call (its message and the strings
// of its details: a cli tool's stderr, an MCP server's error text) to the
// tool's output policy before it reaches the caller and the audit trail:
// secrets and personal data are redacted, markup escaped, and text a
// reject-action detector fires on (instructions aimed at the agent) is
// replaced by a neutral message citing the rule. Findings are recorded on
// inv. It returns err with the checked text.
func (v *Verifier) CheckError(m *tools.Manifest, inv *envelope.Invocation, err error) error {
	if err == nil {
		return nil
	}
	te := api.AsError(err)
	pol := tools.OutputPolicy{}
	if m.OutputPolicy != nil {
		pol = *m.OutputPolicy
	}
	strs := map[string]string{"message": te.Message}
	for k, d := range te.Details {
		if s, ok := d.(string); ok {
			strs[k] = s
		}
	}
	doc, jerr := json.Marshal(strs)
	if jerr != nil {
		return te
	}
	scratch := &envelope.Invocation{Tenant: inv.Tenant}
	// The caller's context does not reach here; the classifier, if any,
	// bounds its own calls (see HTTPClassifier).
	out, rejected := v.sanitize(context.Background(), m, pol, scratch, detect.NewDoc(doc))
	for i, f := range scratch.Findings {
		if f.Path == "/message" {
			scratch.Findings[i].Path = "/error/message"
		} else if f.Path != "" {
			scratch.Findings[i].Path = "/error/details" + f.Path
		}
	}
	v.addFindings(inv, scratch.Findings)
	inv.Metadata.Warnings = append(inv.Metadata.Warnings, scratch.Metadata.Warnings...)
	if rejected != nil {
		re := api.AsError(rejected)
		rule, _ := re.Details["rule"].(string)
		te.Message = fmt.Sprintf("%s failed; its error text was withheld by the output policy (rule %s)", m.Key(), rule)
		for k := range strs {
			if k != "message" {
				te.Details[k] = "[WITHHELD:" + rule + "]"
			}
		}
		return te
	}
	var clean map[string]string
	if json.Unmarshal(out, &clean) != nil {
		return te
	}
	te.Message = clean["message"]
	for k := range strs {
		if k != "message" {
			te.Details[k] = clean[k]
		}
	}
	return te
}

// sanitize applies each detector's action, strictest first.
func (v *Verifier) sanitize(ctx context.Context, m *tools.Manifest, pol tools.OutputPolicy, inv *envelope.Invocation, doc *detect.Doc) ([]byte, error) {
	actions := v.actions(pol, inv.Tenant)
	ds := make([]detect.Detector, 0, len(actions))
	for d := range actions {
		ds = append(ds, d)
	}
	slices.SortFunc(ds, func(x, y detect.Detector) int {
		if a, b := strictness[actions[x]], strictness[actions[y]]; a != b {
			return cmp.Compare(b, a)
		}
		// Secrets before personal data: a password in a URL's userinfo
		// also reads as an e-mail address, and is better named a secret.
		if a, b := x == detect.Secrets, y == detect.Secrets; a != b {
			if a {
				return -1
			}
			return 1
		}
		return cmp.Compare(x, y)
	})
	eng := v.cfg.Detectors
	// One decoded document for every detector: decoded again only after
	// a detector rewrote it.
	for _, d := range ds {
		var found []detect.Finding
		var err error
		switch actions[d] {
		case ActionReject:
			if found, err = eng.ScanDoc(doc, d); err == nil && len(found) == 0 && d == detect.PromptInjection {
				found = v.classify(ctx, inv, doc.Bytes())
			}
			if err == nil && len(found) > 0 {
				f := found[0]
				v.addFindings(inv, record(found, ActionReject, eng.Version()))
				return nil, api.NewError(api.ToolExecutionError, rejectCodes[d],
					"%s returned %s (rule %s at %s)", m.Key(), strings.ReplaceAll(string(d), "_", " "), f.Rule, pointer(f.Path)).
					WithDetail("rule", f.Rule).WithDetail("detector", d).WithDetail("rules_version", eng.Version())
			}
		case ActionRedact:
			found, err = eng.RedactDoc(doc, d)
		case ActionEscape:
			found, err = eng.EscapeDoc(doc, d)
		default:
			if found, err = eng.ScanDoc(doc, d); err == nil && len(found) == 0 && d == detect.PromptInjection {
				found = v.classify(ctx, inv, doc.Bytes())
			}
		}
		if err != nil {
			return nil, api.WrapError(err, api.ToolExecutionError, api.EResultNotJSON, "scanning the result: %v", err)
		}
		if len(found) > 0 {
			v.addFindings(inv, record(found, actions[d], eng.Version()))
			inv.Metadata.Warnings = append(inv.Metadata.Warnings,
				fmt.Sprintf("%d %s finding(s) in the result: %s", len(found), strings.ReplaceAll(string(d), "_", " "), pastTense(actions[d])))
		}
	}
	return doc.Bytes(), nil
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

func record(fs []detect.Finding, action, version string) []envelope.Finding {
	out := make([]envelope.Finding, 0, len(fs))
	for _, f := range fs {
		out = append(out, envelope.Finding{Rule: f.Rule, Detector: string(f.Detector), Path: f.Path, Action: action, RulesVersion: version})
	}
	return out
}

// addFindings appends fs to inv's findings up to MaxFindings; beyond, each
// rule and action has one summary entry whose Count is how many were left
// out.
func (v *Verifier) addFindings(inv *envelope.Invocation, fs []envelope.Finding) {
	for _, f := range fs {
		kept := 0
		summary := -1
		for i, g := range inv.Findings {
			if g.Count == 0 {
				kept++
			} else if g.Rule == f.Rule && g.Action == f.Action {
				summary = i
			}
		}
		switch {
		case kept < v.cfg.MaxFindings:
			inv.Findings = append(inv.Findings, f)
		case summary >= 0:
			inv.Findings[summary].Count++
		default:
			f.Path, f.Count = "", 1
			inv.Findings = append(inv.Findings, f)
		}
	}
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

// schemaECode classes a result's schema failures as the specification does:
// only required fields missing (E3506), only fields of the wrong type
// (E3507), anything else or both (E3501). The messages are the schema
// library's (schemas.Fields).
func schemaECode(fields []api.FieldError) string {
	missing, typed := 0, 0
	for _, f := range fields {
		switch {
		case strings.HasPrefix(f.Message, "missing properties: "):
			missing++
		case strings.HasPrefix(f.Message, "expected ") && strings.Contains(f.Message, ", but got "):
			typed++
		}
	}
	switch len(fields) {
	case missing:
		return api.EResultMissingField
	case typed:
		return api.EResultFieldType
	}
	return api.EResultSchema
}
