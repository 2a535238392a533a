package discovery

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
)

const validRequest = `{"kind":"capability_request","capability":"parse_json","input_contract":"a JSON text","output_contract":"the parsed value","reason":"the text is too long to read"}`

func TestParseCapabilityRequest(t *testing.T) {
	r, err := ParseCapabilityRequest([]byte(validRequest))
	if err != nil {
		t.Fatal(err)
	}
	want := api.CapabilityConstraints{NoNetwork: true, ReadOnlyInput: true, MaxRuntimeMS: 1000, MaxMemoryMB: 64}
	if r.Constraints != want || r.Capability != "parse_json" {
		t.Fatalf("defaults: %+v", r)
	}
	r, err = ParseCapabilityRequest([]byte(strings.Replace(validRequest, `"reason"`, `"constraints":{"no_network":false,"max_runtime_ms":5000},"reason"`, 1)))
	if err != nil || r.Constraints.NoNetwork || !r.Constraints.ReadOnlyInput || r.Constraints.MaxRuntimeMS != 5000 || r.Constraints.MaxMemoryMB != 64 {
		t.Fatalf("stated constraints: %+v %v", r.Constraints, err)
	}
	for name, doc := range map[string]string{
		"unknown field":            strings.Replace(validRequest, `"kind"`, `"extra":1,"kind"`, 1),
		"unknown constraint":       strings.Replace(validRequest, `"reason"`, `"constraints":{"gpu":true},"reason"`, 1),
		"wrong kind":               strings.Replace(validRequest, `"capability_request"`, `"tool_request"`, 1),
		"blank capability":         strings.Replace(validRequest, `"parse_json"`, `"   "`, 1),
		"empty reason":             strings.Replace(validRequest, `"the text is too long to read"`, `""`, 1),
		"capability too long":      strings.Replace(validRequest, `"parse_json"`, `"`+strings.Repeat("x", 129)+`"`, 1),
		"reason too long":          strings.Replace(validRequest, `"the text is too long to read"`, `"`+strings.Repeat("x", 4097)+`"`, 1),
		"contract too long":        strings.Replace(validRequest, `"a JSON text"`, `"`+strings.Repeat("x", 2049)+`"`, 1),
		"missing output contract":  strings.Replace(validRequest, `"output_contract":"the parsed value",`, ``, 1),
		"negative runtime":         strings.Replace(validRequest, `"reason"`, `"constraints":{"max_runtime_ms":-1},"reason"`, 1),
		"not json":                 `{"kind":`,
		"duplicate-free but array": `[]`,
	} {
		if _, err := ParseCapabilityRequest([]byte(doc)); !errors.Is(err, &api.Error{Code: api.InvalidParameters, ECode: api.ECapabilityInvalid}) {
			t.Errorf("%s: %v, want E3040", name, err)
		}
	}
}

func FuzzParseCapabilityRequest(f *testing.F) {
	f.Add([]byte(validRequest))
	f.Add([]byte(`{"kind":"capability_request","constraints":{}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseCapabilityRequest(b)
		if err != nil {
			if !errors.Is(err, &api.Error{Code: api.InvalidParameters, ECode: api.ECapabilityInvalid}) {
				t.Fatalf("uncoded error %v", err)
			}
			return
		}
		if r.Kind != api.CapabilityRequestKind || strings.TrimSpace(r.Capability) == "" || r.Constraints.MaxRuntimeMS < 1 || r.Constraints.MaxMemoryMB < 1 {
			t.Fatalf("accepted %+v", r)
		}
	})
}

// TestEachConstraintMatters: each constraint alone leaves out the tool that
// breaks it, and says why.
func TestEachConstraintMatters(t *testing.T) {
	now := time.Now()
	loose := api.CapabilityConstraints{MaxRuntimeMS: 60000, MaxMemoryMB: 4096}
	base := func(m map[string]any) {
		m["capabilities"] = []string{"parse_json"}
		m["limits"] = map[string]any{"timeout_ms": 500}
	}
	tests := []struct {
		name  string
		edit  func(m map[string]any)
		tight func(*api.CapabilityConstraints)
	}{
		{"no_network: permission", func(m map[string]any) {
			m["permissions"] = map[string]any{"network": []any{map[string]any{"host": "example.com"}}}
		}, func(c *api.CapabilityConstraints) { c.NoNetwork = true }},
		{"no_network: side effect", func(m map[string]any) { m["safety"] = map[string]any{"side_effects": []string{"network.http"}} },
			func(c *api.CapabilityConstraints) { c.NoNetwork = true }},
		{"read_only_input", func(m map[string]any) { m["safety"] = map[string]any{"side_effects": []string{"fs.write"}} },
			func(c *api.CapabilityConstraints) { c.ReadOnlyInput = true }},
		{"max_runtime_ms", func(m map[string]any) { m["limits"] = map[string]any{"timeout_ms": 5000} },
			func(c *api.CapabilityConstraints) { c.MaxRuntimeMS = 1000 }},
		{"max_memory_mb", func(m map[string]any) { m["limits"] = map[string]any{"timeout_ms": 500, "memory_mb": 256} },
			func(c *api.CapabilityConstraints) { c.MaxMemoryMB = 64 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			good := manifest(t, "good", base)
			bad := manifest(t, "bad", func(m map[string]any) { base(m); tt.edit(m) })
			req := api.CapabilityRequest{Capability: "parse_json", Constraints: loose}
			got := MatchCapability(asList(good, bad), req, nil, nil, nil, now)
			if !slices.Equal(ids(got.Candidates), []string{"bad", "good"}) {
				t.Fatalf("loose constraints: %v %v", ids(got.Candidates), got.Considered)
			}
			tt.tight(&req.Constraints)
			got = MatchCapability(asList(good, bad), req, nil, nil, nil, now)
			if !slices.Equal(ids(got.Candidates), []string{"good"}) || got.Considered["bad"] == "" {
				t.Fatalf("tight constraints: %v %v", ids(got.Candidates), got.Considered)
			}
		})
	}
	// The token filter and the capability itself matter too.
	good := manifest(t, "good", base)
	other := manifest(t, "other", func(m map[string]any) { base(m); m["capabilities"] = []string{"resize_image"} })
	got := MatchCapability(asList(good, other), api.CapabilityRequest{Capability: "parse_json", Constraints: loose},
		func(m *tools.Manifest) bool { return m.ID != "good" }, nil, nil, now)
	if len(got.Candidates) != 0 || got.Considered["good"] == "" || got.Considered["other"] != "" {
		t.Fatalf("token filter: %v %v", ids(got.Candidates), got.Considered)
	}
	// A tool whose observed latency fits is kept although its timeout does not.
	slow := manifest(t, "slow", func(m map[string]any) { base(m); m["limits"] = map[string]any{"timeout_ms": 30000} })
	req := api.CapabilityRequest{Capability: "parse_json", Constraints: api.CapabilityConstraints{MaxRuntimeMS: 1000, MaxMemoryMB: 64}}
	if got := MatchCapability(asList(slow), req, nil, nil, func(string) float64 { return 20 }, now); len(got.Candidates) != 1 {
		t.Fatalf("observed latency ignored: %v", got.Considered)
	}
}

// TestChildClaimsNeverWider: the child names exactly the granted tools, its
// budget and lifetime are at most the parent's, the constraints become
// exclusions, and a grant naming a tool that is no candidate is refused.
func TestChildClaimsNeverWider(t *testing.T) {
	now := time.Now()
	parent := &token.Claims{
		ToolID: token.Patterns{"*"}, TenantID: "acme", AgentDID: "did:a", AllowedOperations: []string{"execute"},
		Filesystem: &token.FilesystemGrant{AllowedPaths: []string{"/data"}, Mode: "rw"},
		Network:    &token.NetworkGrant{AllowedHosts: []string{"example.com"}},
		Budget:     &token.Budget{MaxCalls: 2, MaxRuntimeMS: 100000},
		RegisteredClaims: jwt.RegisteredClaims{ID: "p", Issuer: "toolgate", Audience: jwt.ClaimStrings{"toolgate"},
			ExpiresAt: jwt.NewNumericDate(now.Add(5 * time.Minute))},
	}
	cands := []Ranked{{Manifest: manifest(t, "a", nil)}, {Manifest: manifest(t, "b", nil)}}
	req := api.CapabilityRequest{SessionID: "s1", Constraints: api.CapabilityConstraints{NoNetwork: true, ReadOnlyInput: true, MaxRuntimeMS: 1000, MaxMemoryMB: 64}}
	g := policy.Grant{Allow: true, Tools: []string{"a"}, MaxCalls: 4, MaxRuntimeMS: 30000, TTLSeconds: 900}
	c, err := ChildClaims(parent, req, g, cands, now)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case !slices.Equal([]string(c.ToolID), []string{"a"}):
		t.Errorf("tools %v", c.ToolID)
	case c.Budget.MaxCalls != 2 || c.Budget.MaxRuntimeMS != 30000:
		t.Errorf("budget %+v, want calls clamped to the parent's 2", c.Budget)
	case !c.ExpiresAt.Equal(parent.ExpiresAt.Time):
		t.Errorf("expiry %v, want the parent's %v", c.ExpiresAt, parent.ExpiresAt)
	case c.Filesystem.Mode != "ro" || len(c.Network.AllowedHosts) != 0:
		t.Errorf("grants fs %+v net %+v", c.Filesystem, c.Network)
	case !slices.Contains(c.ExcludedSideEffects, "network") || !slices.Contains(c.ExcludedSideEffects, "fs.write"):
		t.Errorf("exclusions %v", c.ExcludedSideEffects)
	case c.SessionID != "s1" || !slices.Equal(c.Chain, []string{"p"}):
		t.Errorf("session %q chain %v", c.SessionID, c.Chain)
	}
	g.Tools = []string{"a", "zzz"}
	if _, err := ChildClaims(parent, req, g, cands, now); !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.ECapabilityNotGranted}) {
		t.Errorf("non-candidate granted: %v", err)
	}
	narrow := *parent
	narrow.ToolID = token.Patterns{"b"}
	g.Tools = []string{"a"}
	if _, err := ChildClaims(&narrow, req, g, cands, now); !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.EAttenuationWidens}) {
		t.Errorf("a tool outside the parent granted: %v", err)
	}
}

func asList(ms ...*tools.Manifest) []*tools.Manifest { return ms }
