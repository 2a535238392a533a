package discovery

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/schemas"
)

// Defaults of an absent constraint: the most restrictive.
const (
	DefaultMaxRuntimeMS = 1000
	DefaultMaxMemoryMB  = 64
	// MaxCandidates is how many matching tools an answer lists.
	MaxCandidates = 5
	// MaxCapabilityRequestBytes bounds a request before it is parsed.
	MaxCapabilityRequestBytes = 32 << 10
)

// ParseCapabilityRequest checks b against the capability request schema
// (schemas/capability-request.schema.json), refusing unknown members and
// over-long fields, and fills in the restrictive defaults. Every failure is
// invalid_parameters with E3040, with field errors when they can be located.
func ParseCapabilityRequest(b []byte) (api.CapabilityRequest, error) {
	bad := func(format string, args ...any) *api.Error {
		return api.NewError(api.InvalidParameters, api.ECapabilityInvalid, format, args...)
	}
	if len(b) > MaxCapabilityRequestBytes {
		return api.CapabilityRequest{}, bad("the request is %d bytes; at most %d", len(b), MaxCapabilityRequestBytes)
	}
	fields, err := schemas.Validate(schemas.CapabilityRequest(), b)
	if err != nil {
		return api.CapabilityRequest{}, bad("the request is not JSON: %v", err)
	}
	if len(fields) > 0 {
		return api.CapabilityRequest{}, bad("the request does not match the capability request schema").WithFields(fields)
	}
	var raw struct {
		api.CapabilityRequest
		Constraints *struct {
			NoNetwork     *bool  `json:"no_network"`
			ReadOnlyInput *bool  `json:"read_only_input"`
			MaxRuntimeMS  *int64 `json:"max_runtime_ms"`
			MaxMemoryMB   *int64 `json:"max_memory_mb"`
		} `json:"constraints"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return api.CapabilityRequest{}, bad("decoding the request: %v", err)
	}
	r := raw.CapabilityRequest
	r.Constraints = api.CapabilityConstraints{NoNetwork: true, ReadOnlyInput: true, MaxRuntimeMS: DefaultMaxRuntimeMS, MaxMemoryMB: DefaultMaxMemoryMB}
	if c := raw.Constraints; c != nil {
		if c.NoNetwork != nil {
			r.Constraints.NoNetwork = *c.NoNetwork
		}
		if c.ReadOnlyInput != nil {
			r.Constraints.ReadOnlyInput = *c.ReadOnlyInput
		}
		if c.MaxRuntimeMS != nil {
			r.Constraints.MaxRuntimeMS = *c.MaxRuntimeMS
		}
		if c.MaxMemoryMB != nil {
			r.Constraints.MaxMemoryMB = *c.MaxMemoryMB
		}
	}
	r.Capability = strings.TrimSpace(r.Capability)
	return r, nil
}

// writeEffects are the side effects read-only input rules out.
var writeEffects = []string{"fs.write", "fs.delete", "fs.chmod", "database.write", "database.delete",
	"cloud.key_write", "cloud.resource_create", "cloud.resource_delete", "payments"}

// Unfit says why m does not satisfy constraints c, or "" when it does.
// expectedMS is the tool's expected latency (observed p95, else declared),
// 0 when unknown.
func Unfit(m *tools.Manifest, c api.CapabilityConstraints, expectedMS float64) string {
	if c.NoNetwork {
		switch {
		case len(m.Permissions.Network) > 0:
			return "it needs the network (permissions.network)"
		case m.Kind == "http" || m.Kind == "model":
			return "it is an " + m.Kind + " tool, which needs the network"
		case HasSideEffect(m.Safety.SideEffects, []string{"network"}):
			return "it declares a network side effect"
		case m.Kind == "cli" && jsonFlag(m.Spec(), "network"), m.Kind == "mcp" && (jsonFlag(m.Spec(), "network") || jsonHas(m.Spec(), "url")):
			return "its executor asks for the network"
		}
	}
	if c.ReadOnlyInput {
		if HasSideEffect(m.Safety.SideEffects, writeEffects) {
			return "it writes (side effects " + strings.Join(m.Safety.SideEffects, ", ") + ")"
		}
		if slices.ContainsFunc(m.Permissions.Filesystem, func(p tools.FilesystemPermission) bool { return p.Mode == "rw" }) {
			return "it needs write access to files"
		}
	}
	timeout := m.Timeout().Milliseconds()
	if timeout > c.MaxRuntimeMS && (expectedMS == 0 || expectedMS > float64(c.MaxRuntimeMS)) {
		if expectedMS > 0 {
			return fmt.Sprintf("it is expected to take %.0f ms, over max_runtime_ms %d", expectedMS, c.MaxRuntimeMS)
		}
		return fmt.Sprintf("it may run %d ms and declares no typical latency within max_runtime_ms %d", timeout, c.MaxRuntimeMS)
	}
	switch mem := m.Limits.MemoryMB; {
	case mem > c.MaxMemoryMB:
		return fmt.Sprintf("its memory limit %d MB is over max_memory_mb %d", mem, c.MaxMemoryMB)
	case mem == 0 && (m.Kind == "cli" || m.Kind == "mcp"):
		return "it runs a process and declares no memory limit (limits.memory_mb)"
	}
	return ""
}

func jsonFlag(raw json.RawMessage, key string) bool {
	var m map[string]any
	if json.Unmarshal(raw, &m) != nil {
		return false
	}
	b, _ := m[key].(bool)
	return b
}

func jsonHas(raw json.RawMessage, key string) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return false
	}
	_, ok := m[key]
	return ok
}

// Matched is the outcome of matching a capability request.
type Matched struct {
	Candidates []Ranked
	// Considered says why each tool that matched the capability by name
	// was left out.
	Considered map[string]string
}

// MatchCapability finds the tools of ms that offer r's capability and
// satisfy its constraints, best first, at most MaxCandidates. allowed, when
// set, is what the agent's token may call. stats may be nil.
func MatchCapability(ms []*tools.Manifest, r api.CapabilityRequest, allowed func(*tools.Manifest) bool,
	stats func(id string) (Stats, bool), expected func(id string) float64, now time.Time) Matched {
	out := Matched{Considered: map[string]string{}}
	var fit []*tools.Manifest
	for _, m := range ms {
		if Match(m, Words(r.Capability), []string{r.Capability}) == 0 {
			continue
		}
		exp := 0.0
		if expected != nil {
			exp = expected(m.ID)
		}
		if exp == 0 && m.Cost != nil {
			exp = float64(m.Cost.TypicalLatencyMS)
		}
		switch {
		case allowed != nil && !allowed(m):
			out.Considered[m.ID] = "the capability token does not grant it"
		case m.State(now) != tools.StateActive && m.State(now) != tools.StateDeprecated:
			out.Considered[m.ID] = "it is " + m.State(now)
		default:
			if why := Unfit(m, r.Constraints, exp); why != "" {
				out.Considered[m.ID] = why
				continue
			}
			fit = append(fit, m)
		}
	}
	out.Candidates = Search(fit, Request{Query: r.Capability, Capabilities: []string{r.Capability}}, stats, now)
	if len(out.Candidates) > MaxCandidates {
		for _, c := range out.Candidates[MaxCandidates:] {
			out.Considered[c.Manifest.ID] = fmt.Sprintf("ranked below the best %d", MaxCandidates)
		}
		out.Candidates = out.Candidates[:MaxCandidates]
	}
	return out
}

// GrantInput is the input of the capability grant policy.
func GrantInput(tenant string, r api.CapabilityRequest, cands []Ranked, parent *token.Claims, now time.Time) map[string]any {
	list := make([]any, 0, len(cands))
	for _, c := range cands {
		m := c.Manifest
		cost := 0.0
		if m.Cost != nil {
			cost = m.Cost.PerCall
		}
		list = append(list, map[string]any{
			"tool_id": m.ID, "version": m.Version, "kind": m.Kind, "risk_level": m.Safety.RiskLevel,
			"side_effects": append([]string{}, m.Safety.SideEffects...), "requires_approval": m.Safety.RequiresApproval,
			"cost_per_call": cost, "score": c.Score,
		})
	}
	r.CapabilityToken = ""
	in := map[string]any{"tenant": tenant, "request": r, "candidates": list, "time": now.UTC().Format(time.RFC3339)}
	if parent != nil {
		in["claims"] = parent
	}
	return in
}

// ChildClaims are the claims of the token a grant carries, attenuated from
// the agent's own: exactly the granted tools (each of them a candidate),
// operation execute, no network when the request asked for none, read-only
// files and no write side effects when it asked for read-only input, the
// grant's budget and lifetime, each at most the parent's. token.Attenuate
// refuses anything wider than the parent (E3216).
func ChildClaims(parent *token.Claims, r api.CapabilityRequest, g policy.Grant, cands []Ranked, now time.Time) (token.Claims, error) {
	var ids []string
	for _, t := range g.Tools {
		if !slices.ContainsFunc(cands, func(c Ranked) bool { return c.Manifest.ID == t }) {
			return token.Claims{}, api.NewError(api.PermissionDenied, api.ECapabilityNotGranted,
				"the policy granted %s, which is not a candidate", t)
		}
		ids = append(ids, t)
	}
	want := token.Claims{
		ToolID: token.Patterns(ids), SessionID: r.SessionID,
		AllowedOperations: []string{token.OperationExecute},
		Budget:            &token.Budget{MaxCalls: g.MaxCalls, MaxRuntimeMS: g.MaxRuntimeMS, MaxCost: g.MaxCost},
	}
	if pb := parent.Budget; pb != nil {
		clamp := func(c *int64, p int64) {
			if p > 0 && (*c == 0 || *c > p) {
				*c = p
			}
		}
		clamp(&want.Budget.MaxCalls, pb.MaxCalls)
		clamp(&want.Budget.MaxRuntimeMS, pb.MaxRuntimeMS)
		if pb.MaxCost > 0 && (want.Budget.MaxCost == 0 || want.Budget.MaxCost > pb.MaxCost) {
			want.Budget.MaxCost = pb.MaxCost
		}
	}
	if !slices.Contains(parent.AllowedOperations, token.OperationExecute) && len(parent.AllowedOperations) > 0 {
		want.AllowedOperations = nil // inherit: Attenuate refuses a widening
	}
	if r.Constraints.NoNetwork {
		if parent.Network != nil {
			want.Network = &token.NetworkGrant{AllowedHosts: []string{}}
		}
		want.ExcludedSideEffects = append(want.ExcludedSideEffects, "network")
	}
	if r.Constraints.ReadOnlyInput {
		if parent.Filesystem != nil {
			want.Filesystem = &token.FilesystemGrant{AllowedPaths: slices.Clone(parent.Filesystem.AllowedPaths), Mode: "ro"}
		}
		want.ExcludedSideEffects = append(want.ExcludedSideEffects, writeEffects...)
	}
	ttl := time.Duration(g.TTLSeconds) * time.Second
	if ttl <= 0 || ttl > token.DefaultMaxLifetime {
		ttl = 15 * time.Minute
	}
	exp := now.Add(ttl)
	if parent.ExpiresAt != nil && exp.After(parent.ExpiresAt.Time) {
		exp = parent.ExpiresAt.Time
	}
	want.ExpiresAt = jwt.NewNumericDate(exp)
	return token.Attenuate(parent, want)
}
