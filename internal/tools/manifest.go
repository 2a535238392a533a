// Package tools describes tools: the manifest that declares one version of a
// tool, and the in-memory registry the stages resolve tool requests against.
package tools

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/Masterminds/semver/v3"
	"github.com/santhosh-tekuri/jsonschema/v5"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/hooks"
	"github.com/toolgate/toolgate/internal/hosts"
	"github.com/toolgate/toolgate/schemas"
)

// Lifecycle states. Active and deprecated versions serve "latest" and range
// requests; sunset and removed ones are only reached by exact version, and
// the route stage decides what that means.
const (
	StateActive     = "active"
	StateDeprecated = "deprecated"
	StateSunset     = "sunset"
	StateRemoved    = "removed"
)

// DefaultTimeout applies to tools whose manifest sets no limits.timeout_ms.
const DefaultTimeout = 30 * time.Second

// Manifest declares one version of a tool. The JSON form is the one
// schemas.Manifest describes. Build manifests with Parse: it checks them and
// compiles their schemas, which ValidateInput and ValidateOutput need.
type Manifest struct {
	ID          string   `json:"id"`
	Name        string   `json:"name"`
	Version     string   `json:"version"`
	Description string   `json:"description"`
	Category    string   `json:"category,omitempty"`
	Tags        []string `json:"tags,omitempty"`
	Kind        string   `json:"kind"`
	// Site names the site whose execute worker runs the tool
	// (docs/sites.md); empty: the hub's.
	Site string `json:"site,omitempty"`

	// Builtin configures a builtin tool. Every other kind's configuration
	// is the member named by the kind, which the kind decodes itself
	// (Spec).
	Builtin *BuiltinConfig `json:"builtin,omitempty"`

	InputSchema  json.RawMessage `json:"input_schema"`
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`

	Safety         Safety          `json:"safety,omitzero"`
	Limits         Limits          `json:"limits,omitzero"`
	Permissions    Permissions     `json:"permissions,omitzero"`
	RateLimit      *RateLimit      `json:"rate_limit,omitempty"`
	RetryPolicy    *RetryPolicy    `json:"retry_policy,omitempty"`
	CircuitBreaker *CircuitBreaker `json:"circuit_breaker,omitempty"`
	Cost           *Cost           `json:"cost,omitempty"`
	Lifecycle      Lifecycle       `json:"lifecycle,omitzero"`
	// Checkpointing says how toolgate checkpoints the tool's runs.
	Checkpointing *Checkpointing `json:"checkpointing,omitempty"`
	// Documents says how the tool takes a call's document_context.
	Documents *Documents `json:"documents,omitempty"`

	// Discovery metadata: semantic capability tags, worked
	// examples, what the tool needs, and who made it.
	Capabilities []string      `json:"capabilities,omitempty"`
	Examples     []Example     `json:"examples,omitempty"`
	Dependencies *Dependencies `json:"dependencies,omitempty"`
	Metadata     *Metadata     `json:"metadata,omitempty"`

	// InputChecks names, by JSON pointer into the parameters, the checks a
	// parameter gets beyond its schema: "path", "sql", "shell", "prompt".
	InputChecks map[string][]string `json:"input_checks,omitempty"`
	// OutputPolicy says how verify treats the result.
	OutputPolicy *OutputPolicy `json:"output_policy,omitempty"`
	// Hooks say what happens when a call of this tool is denied, fails,
	// times out or overspends (docs/hooks.md).
	Hooks []hooks.Spec `json:"hooks,omitempty"`

	spec   json.RawMessage // the member named by Kind: the kind's configuration (Spec)
	ver    *semver.Version // parsed Version, for the registry's ordering
	input  *jsonschema.Schema
	output *jsonschema.Schema // nil when the manifest has no output schema
	digest string             // SHA-256 (hex) of the document parsed
	hooks  *hooks.Set         // nil when the manifest declares no hooks
}

// BuiltinConfig configures a tool implemented inside the binary.
type BuiltinConfig struct {
	Function string `json:"function"`
}

// Safety says what a tool may do to the world.
type Safety struct {
	RiskLevel        string   `json:"risk_level,omitempty"` // low, medium, high or critical
	SideEffects      []string `json:"side_effects,omitempty"`
	RequiresApproval bool     `json:"requires_approval,omitempty"`
	// Approvers is how many different people must approve a call that
	// needs approval (the two-person rule); 0 and 1 mean one.
	Approvers  int  `json:"approvers,omitempty"`
	Reversible bool `json:"reversible,omitempty"`
	Idempotent bool `json:"idempotent,omitempty"`
}

// Limits are the resource ceilings of one invocation; zero means unset.
type Limits struct {
	TimeoutMS     int64 `json:"timeout_ms,omitempty"`
	CPUMillicores int64 `json:"cpu_millicores,omitempty"`
	MemoryMB      int64 `json:"memory_mb,omitempty"`
	PIDs          int64 `json:"pids,omitempty"`
	OutputBytes   int64 `json:"output_bytes,omitempty"`
	CPUSeconds    int64 `json:"cpu_seconds,omitempty"`
	FileSizeMB    int64 `json:"file_size_mb,omitempty"`
	TmpMB         int64 `json:"tmp_mb,omitempty"`
	// ConcurrentPerAgent replaces, for calls of this tool, how many calls
	// one agent may have running at once (Defaults.ConcurrentToolsPerAgent).
	ConcurrentPerAgent int64 `json:"concurrent_per_agent,omitempty"`
}

// Permissions lists the resources a tool needs.
type Permissions struct {
	Filesystem  []FilesystemPermission `json:"filesystem,omitempty"`
	Network     []NetworkPermission    `json:"network,omitempty"`
	Credentials []string               `json:"credentials,omitempty"`
}

// FilesystemPermission grants access to a path under the configured file root.
type FilesystemPermission struct {
	Path string `json:"path"`
	Mode string `json:"mode"` // ro or rw
}

// NetworkPermission allows connections to a host; Port 0 means any port.
type NetworkPermission struct {
	Host string `json:"host"`
	Port int    `json:"port,omitempty"`
}

// DeclaresEndpoint reports whether one of perms names host (a pattern, see
// hosts.Match) and port (0 in a permission: any port).
func DeclaresEndpoint(perms []NetworkPermission, host string, port int) bool {
	return slices.ContainsFunc(perms, func(n NetworkPermission) bool {
		return hosts.Match(n.Host, host) && (n.Port == 0 || n.Port == port)
	})
}

// RateLimit is a token bucket: Requests per PerSeconds, plus Burst.
type RateLimit struct {
	Requests   int `json:"requests"`
	PerSeconds int `json:"per_seconds"`
	Burst      int `json:"burst,omitempty"`
}

// RetryPolicy says how failed invocations are retried.
type RetryPolicy struct {
	MaxAttempts     int      `json:"max_attempts,omitempty"`
	BaseDelayMS     int64    `json:"base_delay_ms,omitempty"`
	MaxDelayMS      int64    `json:"max_delay_ms,omitempty"`
	RetryableErrors []string `json:"retryable_errors,omitempty"`
}

// CircuitBreaker says when to stop calling a failing tool for a while.
type CircuitBreaker struct {
	FailureRateThreshold float64 `json:"failure_rate_threshold,omitempty"` // percent
	SlidingWindowSize    int     `json:"sliding_window_size,omitempty"`
	MinimumCalls         int     `json:"minimum_calls,omitempty"`
	WaitDurationSeconds  int     `json:"wait_duration_seconds,omitempty"`
	HalfOpenCalls        int     `json:"half_open_calls,omitempty"`
	SlowCallMS           int64   `json:"slow_call_ms,omitempty"`
	// WindowSeconds makes the window time-based.
	WindowSeconds int `json:"window_seconds,omitempty"`
	// Key names the breaker; tools calling one endpoint share it.
	Key string `json:"key,omitempty"`
}

// Cost is what an invocation costs.
type Cost struct {
	PerCall          float64 `json:"per_call,omitempty"`
	Currency         string  `json:"currency,omitempty"`
	TypicalLatencyMS int64   `json:"typical_latency_ms,omitempty"`
}

// Input check names.
const (
	CheckPath   = "path"
	CheckSQL    = "sql"
	CheckShell  = "shell"
	CheckPrompt = "prompt"
)

// OutputPolicy governs result verification.
type OutputPolicy struct {
	// Mode "strict" (default) rejects a result that fails the output schema;
	// "lenient" passes it with a warning.
	Mode string `json:"mode,omitempty"`
	// Coerce converts strings to the number, integer, boolean or date-time
	// the output schema asks for before validating.
	Coerce bool `json:"coerce,omitempty"`
	// MaxBytes bounds the result (default 1 MiB).
	MaxBytes int `json:"max_bytes,omitempty"`
	// Actions maps a detector (secrets, pii, prompt_injection,
	// sql_injection, command_injection, malicious_code, xss) to reject,
	// redact, escape or flag.
	Actions map[string]string `json:"actions,omitempty"`
}

// Checkpointing is a tool's checkpoint settings.
type Checkpointing struct {
	Micro *MicroCheckpoints `json:"micro_checkpoints,omitempty"`
}

// MicroCheckpoints spaces the micro checkpoints of a tool's runs, or turns
// them off (Enabled false). Unset members leave the deployment's default.
type MicroCheckpoints struct {
	Enabled         *bool    `json:"enabled,omitempty"`
	IntervalSeconds *float64 `json:"interval_seconds,omitempty"`
}

// MicroInterval is how m spaces its micro checkpoints given the
// deployment's default: off when the tool opts out.
func (m *Manifest) MicroInterval(def time.Duration) (interval time.Duration, on bool) {
	if m.Checkpointing == nil || m.Checkpointing.Micro == nil {
		return def, true
	}
	mc := m.Checkpointing.Micro
	if mc.Enabled != nil && !*mc.Enabled {
		return 0, false
	}
	if mc.IntervalSeconds != nil {
		return time.Duration(*mc.IntervalSeconds * float64(time.Second)), true
	}
	return def, true
}

// Lifecycle is where a version stands between release and removal. An empty
// State means active. DeprecationDate and SunsetAt move the version on by
// themselves when they pass (Manifest.State).
type Lifecycle struct {
	State               string    `json:"state,omitempty"`
	DeprecatedInFavorOf string    `json:"deprecated_in_favor_of,omitempty"`
	SunsetAt            time.Time `json:"sunset_at,omitzero"`
	DeprecationDate     time.Time `json:"deprecation_date,omitzero"`
	CreatedAt           time.Time `json:"created_at,omitzero"`
	UpdatedAt           time.Time `json:"updated_at,omitzero"`
	ReleaseNotes        string    `json:"release_notes,omitempty"`
	// RemovedAt and RemovedBy say when and by whom tools delete removed
	// the version; the registry fills them from the stored removal.
	RemovedAt time.Time `json:"removed_at,omitzero"`
	RemovedBy string    `json:"removed_by,omitempty"`
}

// Example is one worked invocation, shown to the agent choosing a tool.
type Example struct {
	Description    string          `json:"description"`
	Input          json.RawMessage `json:"input"`
	ExpectedOutput json.RawMessage `json:"expected_output,omitempty"`
}

// Dependencies are what a tool needs besides its own permissions.
type Dependencies struct {
	RequiredTools       []string `json:"required_tools,omitempty"`
	RequiredPermissions []string `json:"required_permissions,omitempty"`
	OS                  []string `json:"os,omitempty"`
	Libraries           []string `json:"libraries,omitempty"`
}

// Metadata says who made a tool and where to read about it.
type Metadata struct {
	Author           string `json:"author,omitempty"`
	DocumentationURL string `json:"documentation_url,omitempty"`
	SourceCodeURL    string `json:"source_code_url,omitempty"`
	License          string `json:"license,omitempty"`
}

// State is the version's lifecycle state at now: the declared state, moved
// to sunset once sunset_at has passed and from active to deprecated once
// deprecation_date has. A removed version stays removed.
func (m *Manifest) State(now time.Time) string {
	l := m.Lifecycle
	st := cmp.Or(l.State, StateActive)
	switch {
	case st == StateRemoved:
		return st
	case !l.SunsetAt.IsZero() && !now.Before(l.SunsetAt):
		return StateSunset
	case st == StateActive && !l.DeprecationDate.IsZero() && !now.Before(l.DeprecationDate):
		return StateDeprecated
	}
	return st
}

// Digest is the SHA-256 (hex) of the manifest document as stored in the
// registry (Parse's input): what a receipt names the manifest by.
func (m *Manifest) Digest() string { return m.digest }

// Parse checks doc against the tool manifest schema, decodes it, compiles its
// input and output schemas and fills in defaults. doc is in toolgate's form
// or in the specification's (seed 002, 5.2.1; see Native). Every failure is
// an invalid_parameters error with E-code E3008, with field errors, pointing
// into doc as written, when the problem can be located.
func Parse(doc []byte) (*Manifest, error) {
	native, origin, err := nativeForm(doc)
	if err != nil {
		return nil, err
	}
	m, err := parseNative(native)
	if err != nil && origin != nil {
		relocate(err, origin)
	}
	return m, err
}

// breakerOnly reports whether every field error is a circuit breaker's value
// out of range: the specification's own code (E3403). An unknown member
// stays an invalid manifest.
func breakerOnly(fields []api.FieldError) bool {
	return !slices.ContainsFunc(fields, func(f api.FieldError) bool {
		return !strings.HasPrefix(f.Location+"/", "/circuit_breaker/") || strings.HasPrefix(f.Message, "additionalProperties ")
	})
}

// parseNative is Parse for a document in toolgate's form.
func parseNative(doc []byte) (*Manifest, error) {
	fields, err := schemas.Validate(schemas.Manifest(), doc)
	if err != nil {
		return nil, api.WrapError(err, api.InvalidParameters, api.EInvalidManifest, "manifest: %v", err)
	}
	if len(fields) > 0 {
		if breakerOnly(fields) {
			return nil, api.NewError(api.InvalidParameters, api.EBreakerConfig,
				"the circuit breaker configuration is invalid").WithFields(fields)
		}
		return nil, invalid("manifest does not match the tool manifest schema").WithFields(fields)
	}
	m := new(Manifest)
	sum := sha256.Sum256(doc)
	m.digest = hex.EncodeToString(sum[:])
	if err := json.Unmarshal(doc, m); err != nil {
		// The schema allows values Go cannot hold, such as 1e3 for an
		// integer or a number beyond int64.
		return nil, invalid("decoding manifest: %v", err)
	}
	// The schema pattern is strict semver, but components may still
	// overflow uint64.
	if m.ver, err = semver.StrictNewVersion(m.Version); err != nil {
		return nil, invalid("version %q: %v", m.Version, err).
			WithFields([]api.FieldError{{Location: "/version", Message: err.Error()}})
	}
	if m.input, err = compile(m, "input_schema", m.InputSchema); err != nil {
		return nil, err
	}
	if len(m.OutputSchema) > 0 {
		if m.output, err = compile(m, "output_schema", m.OutputSchema); err != nil {
			return nil, err
		}
	}
	// Strict result validation with nothing to validate against would pass
	// every result unchecked: the manifest asked for what it cannot have.
	if m.OutputPolicy != nil && m.OutputPolicy.Mode == "strict" && m.output == nil {
		return nil, api.NewError(api.InvalidParameters, api.EResultSchemaMissing,
			"%s asks for strict result validation (output_policy.mode) and declares no output schema", m.Key()).
			WithFields([]api.FieldError{{Location: "/output_schema", Message: "required by output_policy.mode strict"}})
	}
	if len(m.Hooks) > 0 {
		var raw struct {
			Hooks json.RawMessage `json:"hooks"`
		}
		_ = json.Unmarshal(doc, &raw) // decoded above
		wrapped := append(append([]byte(`{"hooks":`), raw.Hooks...), '}')
		if m.hooks, err = hooks.Parse(wrapped, hooks.SourceManifest); err != nil {
			return nil, err
		}
	}
	if fields := m.checkOverrides(); len(fields) > 0 {
		code := api.EInvalidManifest
		if breakerOnly(fields) {
			code = api.EBreakerConfig
		}
		return nil, api.NewError(api.InvalidParameters, code, "%s: %s: %s", m.Key(), fields[0].Location, fields[0].Message).WithFields(fields)
	}
	if m.Safety.RiskLevel == "" {
		m.Safety.RiskLevel = "low"
	}
	m.Safety.SideEffects = impliedEffects(m.Kind, m.Safety.SideEffects)
	if m.Lifecycle.State == "" {
		m.Lifecycle.State = StateActive
	}
	return m, nil
}

// NetworkEffect is the side effect of reaching the network.
const NetworkEffect = "network"

// impliedEffects adds the side effects a tool's kind has whatever its
// manifest declares: an http or model tool reaches the network, so a token
// that excludes "network" cannot call it.
func impliedEffects(kind string, effects []string) []string {
	if kind != "http" && kind != "model" {
		return effects
	}
	for _, e := range effects {
		if e == NetworkEffect || strings.HasPrefix(e, NetworkEffect+".") {
			return effects
		}
	}
	return append(slices.Clip(effects), NetworkEffect)
}

func invalid(format string, args ...any) *api.Error {
	return api.NewError(api.InvalidParameters, api.EInvalidManifest, format, args...)
}

// compile compiles one of m's schemas; field errors point into the manifest.
func compile(m *Manifest, field string, schema []byte) (*jsonschema.Schema, error) {
	s, err := schemas.Compile(m.Key()+"/"+field, schema)
	if err == nil {
		return s, nil
	}
	fields := schemas.Fields(err)
	for i := range fields {
		fields[i].Location = "/" + field + fields[i].Location
	}
	if len(fields) == 0 {
		fields = []api.FieldError{{Location: "/" + field, Message: err.Error()}}
	}
	return nil, api.WrapError(err, api.InvalidParameters, api.EInvalidManifest,
		"%s of %s is not a valid JSON Schema", field, m.Key()).WithFields(fields)
}

// ValidateInput checks invocation parameters against the input schema. It
// returns nil, nil when they are valid; absent or null parameters count as
// {}. The error is for parameters that are not JSON. A manifest that did not
// come from Parse has no compiled schema and accepts anything.
func (m *Manifest) ValidateInput(params []byte) ([]api.FieldError, error) {
	if m.input == nil {
		return nil, nil
	}
	p := bytes.TrimSpace(params)
	if len(p) == 0 || string(p) == "null" {
		p = []byte("{}")
	}
	return schemas.Validate(m.input, p)
}

// ValidateOutput checks a tool result against the output schema. It returns
// nil, nil when the result is valid or the tool declares no output schema.
// The error is for a result that is not JSON.
func (m *Manifest) ValidateOutput(result []byte) ([]api.FieldError, error) {
	if m.output == nil {
		return nil, nil
	}
	return schemas.Validate(m.output, result)
}

// Spec is the manifest member named by its kind, the kind's configuration
// (the http object of an http tool); nil when it has none.
func (m *Manifest) Spec() json.RawMessage { return m.spec }

// WithSpec returns a copy of m whose kind's configuration is spec: a
// manifest built in Go rather than decoded.
func (m Manifest) WithSpec(spec json.RawMessage) *Manifest {
	m.spec = spec
	return &m
}

// manifestFields is Manifest without its methods, for its JSON codec.
type manifestFields Manifest

// UnmarshalJSON decodes a manifest, keeping the member its kind names as
// the kind's configuration.
func (m *Manifest) UnmarshalJSON(b []byte) error {
	if err := json.Unmarshal(b, (*manifestFields)(m)); err != nil {
		return err
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(b, &members); err != nil {
		return err
	}
	m.spec = members[m.Kind]
	return nil
}

// MarshalJSON encodes a manifest with its kind's configuration as the
// member the kind names, where the manifest's fields put it: after kind
// (and builtin), before input_schema.
func (m Manifest) MarshalJSON() ([]byte, error) {
	// Escaping is left to the caller's encoder, as for the other fields.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode((*manifestFields)(&m)); err != nil {
		return nil, err
	}
	out := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if m.Kind == "builtin" || len(m.spec) == 0 {
		return out, nil
	}
	// The fields before input_schema are strings, string arrays and the
	// builtin object, none of which can hold this byte sequence.
	at := bytes.Index(out, []byte(`,"input_schema":`))
	if at < 0 {
		return nil, fmt.Errorf("%s: encoding: no input_schema member", m.Key())
	}
	key, err := json.Marshal(m.Kind)
	if err != nil {
		return nil, err
	}
	var spec bytes.Buffer
	if err := json.Compact(&spec, m.spec); err != nil {
		return nil, fmt.Errorf("%s: encoding its %s configuration: %w", m.Key(), m.Kind, err)
	}
	res := make([]byte, 0, len(out)+len(key)+spec.Len()+2)
	res = append(res, out[:at]...)
	res = append(res, ',')
	res = append(res, key...)
	res = append(res, ':')
	res = append(res, spec.Bytes()...)
	return append(res, out[at:]...), nil
}

// HookSet returns the manifest's compiled hooks, nil when it has none.
func (m *Manifest) HookSet() *hooks.Set { return m.hooks }

// Timeout is the wall-clock limit of one invocation.
func (m *Manifest) Timeout() time.Duration {
	if m.Limits.TimeoutMS > 0 {
		return time.Duration(m.Limits.TimeoutMS) * time.Millisecond
	}
	return DefaultTimeout
}

// Key identifies the manifest in logs and errors: id@version.
func (m *Manifest) Key() string { return m.ID + "@" + m.Version }

// serving reports whether m may answer "latest" and range requests at now.
func (m *Manifest) serving(now time.Time) bool {
	switch m.State(now) {
	case StateSunset, StateRemoved:
		return false
	}
	return true
}

// Lookup evaluates a JSON pointer (RFC 6901) in a decoded JSON document.
func Lookup(doc any, ptr string) (any, bool) {
	if ptr == "" || ptr == "/" {
		return doc, true
	}
	cur := doc
	for _, tok := range strings.Split(strings.TrimPrefix(ptr, "/"), "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch c := cur.(type) {
		case map[string]any:
			v, ok := c[tok]
			if !ok {
				return nil, false
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) {
				return nil, false
			}
			cur = c[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

// PathParameters returns the string values of the parameters the manifest
// marks with the path check.
func (m *Manifest) PathParameters(params []byte) []string {
	var doc any
	if len(m.InputChecks) == 0 || json.Unmarshal(params, &doc) != nil {
		return nil
	}
	var out []string
	for ptr, checks := range m.InputChecks {
		if !slices.Contains(checks, CheckPath) {
			continue
		}
		if v, ok := Lookup(doc, ptr); ok {
			if s, ok := v.(string); ok {
				out = append(out, s)
			}
		}
	}
	slices.Sort(out)
	return out
}

// Documents is how a tool is handed the documents of a call's
// document_context (docs/documents.md).
type Documents struct {
	Parameter string `json:"parameter"`
	MaxBytes  int    `json:"max_bytes,omitempty"`
}
