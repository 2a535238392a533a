package policy

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/toolgate/toolgate/api"
)

//go:embed testdata/cases.json
var casesJSON []byte

type policyCase struct {
	Name             string         `json:"name"`
	Data             map[string]any `json:"data"`
	Input            map[string]any `json:"input"`
	Allow            bool           `json:"allow"`
	RequiresApproval bool           `json:"requires_approval"`
	Reason           string         `json:"reason"`
	Code             string         `json:"code"`
}

func TestShippedPolicy(t *testing.T) {
	var cases []policyCase
	if err := json.Unmarshal(casesJSON, &cases); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			e, err := New(ctx, map[string]string{"default.rego": DefaultModule()}, c.Data)
			if err != nil {
				t.Fatal(err)
			}
			d, err := e.Eval(ctx, c.Input)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allow != c.Allow || d.RequiresApproval != c.RequiresApproval {
				t.Fatalf("decision %+v, want allow=%v requires_approval=%v", d, c.Allow, c.RequiresApproval)
			}
			if d.Code != c.Code {
				t.Fatalf("code %q, want %q (%v)", d.Code, c.Code, d.Reasons)
			}
			if c.Reason != "" && !strings.Contains(strings.Join(d.Reasons, "|"), c.Reason) {
				t.Fatalf("reasons %q lack %q", d.Reasons, c.Reason)
			}
		})
	}
}

func TestAnythingButAnExplicitAllowDenies(t *testing.T) {
	ctx := context.Background()
	for name, src := range map[string]string{
		"decision not obj":   "package toolgate.authz\ndecision := \"yes\"\n",
		"allow not a bool":   "package toolgate.authz\ndecision := {\"allow\": \"true\"}\n",
		"conditional, unmet": "package toolgate.authz\ndecision := {\"allow\": true} if input.never\n",
	} {
		t.Run(name, func(t *testing.T) {
			e, err := New(ctx, map[string]string{"p.rego": src}, nil)
			if err != nil {
				t.Fatal(err)
			}
			d, err := e.Eval(ctx, map[string]any{"tenant": "a"})
			if err != nil || d.Allow || len(d.Reasons) == 0 {
				t.Fatalf("decision %+v, %v: want a denial with a reason", d, err)
			}
		})
	}
}

// TestPolicyWithoutDecisionIsRefused: a module that compiles but defines no
// toolgate.authz.decision would deny every call; it is refused at push and
// load, which both go through New.
func TestPolicyWithoutDecisionIsRefused(t *testing.T) {
	for name, modules := range map[string]map[string]string{
		"other rule":            {"p.rego": "package toolgate.authz\nother := true\n"},
		"other package":         {"p.rego": "package toolgate.authz2\ndecision := {\"allow\": true}\n"},
		"sub-package":           {"p.rego": "package toolgate.authz.extra\ndecision := {\"allow\": true}\n"},
		"helpers only, 2 files": {"a.rego": "package toolgate.authz\nallow := true\n", "b.rego": "package toolgate.lib\nx := 1\n"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(context.Background(), modules, nil)
			var te *api.Error
			if !errors.As(err, &te) || te.ECode != api.EPolicyFailed || !strings.Contains(te.Message, "toolgate.authz.decision") {
				t.Fatalf("err = %v, want E3206 naming toolgate.authz.decision", err)
			}
		})
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "p.rego"), []byte("package toolgate.authz\nother := true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadDir(context.Background(), dir); !errors.Is(err, &api.Error{Code: api.InvalidParameters, ECode: api.EPolicyFailed}) {
		t.Fatalf("LoadDir: %v, want E3206", err)
	}
}

func TestCompileErrorsAreRefused(t *testing.T) {
	_, err := New(context.Background(), map[string]string{"bad.rego": "package toolgate.authz\n\ndecision := {\n"}, nil)
	var te *api.Error
	if !errors.As(err, &te) || te.ECode != api.EPolicyFailed || !strings.Contains(te.Message, "bad.rego:") {
		t.Fatalf("err = %v, want E3206 naming bad.rego with a line", err)
	}
}

func TestNetworkBuiltinsAreUnavailable(t *testing.T) {
	src := `package toolgate.authz
decision := {"allow": r.status_code == 200} if { r := http.send({"method": "GET", "url": "http://127.0.0.1:1"}) }`
	_, err := New(context.Background(), map[string]string{"net.rego": src}, nil)
	if err == nil || !strings.Contains(err.Error(), "http.send") {
		t.Fatalf("a policy calling http.send compiled: %v", err)
	}
}

func TestConcurrentEval(t *testing.T) {
	e, err := Default(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	input := map[string]any{"tenant": "acme", "request": map[string]any{"agent_context": map[string]any{"tenant_id": "acme"}},
		"tool": map[string]any{"id": "x", "kind": "builtin", "safety": map[string]any{"risk_level": "low"}}}
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				if d, err := e.Eval(context.Background(), input); err != nil || !d.Allow {
					t.Errorf("decision %+v, %v", d, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestLoadDirAndFile(t *testing.T) {
	dir := t.TempDir()
	src := "package toolgate.authz\ndecision := {\"allow\": input.tenant in data.toolgate.tenants}\n"
	if err := os.WriteFile(filepath.Join(dir, "p.rego"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data.json"), []byte(`{"toolgate":{"tenants":["acme"]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	e, err := LoadDir(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := e.Eval(ctx, map[string]any{"tenant": "acme"}); !d.Allow {
		t.Fatal("data.json was not loaded")
	}
	if d, _ := e.Eval(ctx, map[string]any{"tenant": "other"}); d.Allow {
		t.Fatal("a tenant outside data was allowed")
	}
	f, err := LoadFile(ctx, filepath.Join(dir, "p.rego"))
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := f.Eval(ctx, map[string]any{"tenant": "acme"}); d.Allow {
		t.Fatal("without data, membership must not hold")
	}
}

// TestDecisionReadAsItsJSON: a decision is read from OPA's value as it
// would be from its JSON form: reasons as an array or a set, approvers an
// integer from 2 to 5 only, and whatever is not a boolean allow a denial.
func TestDecisionReadAsItsJSON(t *testing.T) {
	ctx := context.Background()
	for name, c := range map[string]struct {
		rule string
		want Decision
	}{
		"allowed":            {`{"allow": true, "reasons": [], "requires_approval": false}`, Decision{Allow: true}},
		"approval by two":    {`{"allow": true, "reasons": ["b", "a"], "requires_approval": true, "approvers": 2}`, Decision{Allow: true, RequiresApproval: true, Reasons: []string{"b", "a"}, Approvers: 2}},
		"approvers as float": {`{"allow": true, "requires_approval": true, "approvers": 2.0}`, Decision{Allow: true, RequiresApproval: true}},
		"approvers too many": {`{"allow": true, "approvers": 6}`, Decision{Allow: true}},
		"approvers a string": {`{"allow": true, "approvers": "3"}`, Decision{Allow: true}},
		"reasons as a set":   {`{"allow": false, "reasons": {"x", "y", 3}, "code": "E3209"}`, Decision{Reasons: []string{"x", "y"}, Code: "E3209"}},
		"code not a string":  {`{"allow": false, "reasons": ["r"], "code": 3209}`, Decision{Reasons: []string{"r"}}},
		"no reasons":         {`{"allow": false}`, Decision{Reasons: []string{"denied by policy"}}},
		"allow not boolean":  {`{"allow": "true"}`, Decision{Reasons: []string{"the policy's decision has no boolean allow"}}},
		"not an object":      {`["allow"]`, Decision{Reasons: []string{"the policy's decision is not an object"}}},
	} {
		e, err := New(ctx, map[string]string{"p.rego": "package toolgate.authz\ndecision := " + c.rule}, nil)
		if err != nil {
			t.Fatal(err)
		}
		d, err := e.Eval(ctx, map[string]any{})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := json.Marshal(d)
		want, _ := json.Marshal(c.want)
		if string(got) != string(want) {
			t.Errorf("%s: %s, want %s", name, got, want)
		}
	}
}

// BenchmarkEvalValue is an evaluation on an input in OPA's form, as the
// authorize stage hands it: evaluated in full, and read back from the memo
// as for a call alike an earlier one.
func BenchmarkEvalValue(b *testing.B) {
	e, err := Default(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	input := ast.MustInterfaceToValue(map[string]any{"tenant": "acme", "request": map[string]any{"agent_context": map[string]any{"tenant_id": "acme"}},
		"tool": map[string]any{"id": "x", "kind": "builtin", "safety": map[string]any{"risk_level": "low"}}})
	for name, e := range map[string]*Engine{"evaluated": unkept(e), "kept": e} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := e.Eval(context.Background(), input); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkEval(b *testing.B) {
	e, err := Default(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	input := map[string]any{"tenant": "acme", "request": map[string]any{"agent_context": map[string]any{"tenant_id": "acme"}},
		"tool": map[string]any{"id": "x", "kind": "builtin", "safety": map[string]any{"risk_level": "low"}}}
	b.ResetTimer()
	for b.Loop() {
		if _, err := e.Eval(context.Background(), input); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEvalFreshToken is a call whose capability token was minted for
// it: the claims differ from every earlier call's in their id and times
// only, the grants and budget the shipped policy reads being the same.
func BenchmarkEvalFreshToken(b *testing.B) {
	e, err := Default(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	// More tokens than the memo keeps, so none is seen twice as such.
	ins := make([]ast.Value, 2*maxMemoDecisions)
	for i := range ins {
		ins[i] = ast.MustInterfaceToValue(map[string]any{"tenant": "acme",
			"request": map[string]any{"agent_context": map[string]any{"tenant_id": "acme"}},
			"tool":    map[string]any{"id": "x", "kind": "builtin", "safety": map[string]any{"risk_level": "low"}},
			"claims": map[string]any{"tool_id": []any{"*"}, "tenant_id": "acme", "jti": fmt.Sprintf("tok-%d", i),
				"iat": 1796011308 + i, "exp": 1796097708 + i, "filesystem_permissions": map[string]any{"allowed_paths": []any{"/"}, "mode": "ro"}}})
	}
	i := 0
	for b.Loop() {
		if _, err := e.Eval(context.Background(), ins[i%len(ins)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
