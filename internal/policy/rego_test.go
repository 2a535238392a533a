package policy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/format"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/tester"
)

// TestRegoPolicy is `opa fmt --diff`, `opa check --strict` and `opa test`
// over the policy directory, through OPA's Go packages, so `go test` (and
// `make test`) runs the Rego unit tests beside the policy.
func TestRegoPolicy(t *testing.T) {
	files, err := filepath.Glob("*.rego")
	if err != nil || len(files) == 0 {
		t.Fatalf("no .rego files: %v", err)
	}
	modules := map[string]string{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		modules[f] = string(src)
		formatted, err := format.Source(f, src)
		if err != nil {
			t.Fatalf("opa fmt %s: %v", f, err)
		}
		if !bytes.Equal(formatted, src) {
			t.Errorf("%s is not formatted as opa fmt would; want:\n%s", f, formatted)
		}
	}
	if !strings.Contains(strings.Join(files, " "), "_test.rego") {
		t.Fatal("no *_test.rego beside the policy")
	}
	passed, failures, err := runRegoTests(context.Background(), modules)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range failures {
		t.Error(f)
	}
	if passed == 0 {
		t.Fatal("opa test ran no tests")
	}
	t.Logf("%d Rego tests passed", passed)
}

// TestRegoFailuresFailGo: a failing or erroring Rego test, and a module
// that strict checking refuses, are reported, so TestRegoPolicy cannot pass
// over a broken policy test.
func TestRegoFailuresFailGo(t *testing.T) {
	ctx := context.Background()
	for name, src := range map[string]string{
		"false":   "package x_test\n\ntest_false if false\n",
		"error":   "package x_test\n\ntest_error if 1 / 0 == 1\n",
		"unsafe":  "package x_test\n\ntest_unused if {\n\tx := 1\n\ttrue\n}\n",
		"compile": "package x_test\n\ntest_bad if {\n",
	} {
		t.Run(name, func(t *testing.T) {
			passed, failures, err := runRegoTests(ctx, map[string]string{"x_test.rego": src})
			if err == nil && len(failures) == 0 {
				t.Fatalf("a broken Rego test passed (%d passed)", passed)
			}
		})
	}
}

// runRegoTests compiles modules strictly (`opa check --strict`), with the
// same capabilities as the engine, and runs every test_ rule in them.
func runRegoTests(ctx context.Context, modules map[string]string) (passed int, failures []string, err error) {
	parsed := map[string]*ast.Module{}
	for name, src := range modules {
		m, err := ast.ParseModuleWithOpts(name, src, ast.ParserOptions{RegoVersion: ast.RegoV1})
		if err != nil {
			return 0, nil, fmt.Errorf("opa check: %w", err)
		}
		parsed[name] = m
	}
	strict := ast.NewCompiler().WithStrict(true).WithCapabilities(capabilities()).WithEnablePrintStatements(false)
	if strict.Compile(parsed); strict.Failed() {
		return 0, nil, fmt.Errorf("opa check --strict: %w", strict.Errors)
	}
	ch, err := tester.NewRunner().
		SetCompiler(ast.NewCompiler().WithStrict(true).WithCapabilities(capabilities())).
		SetStore(inmem.New()).
		RaiseBuiltinErrors(true).
		SetModules(parsed).
		RunTests(ctx, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("opa test: %w", err)
	}
	for r := range ch {
		switch {
		case r.Error != nil:
			failures = append(failures, fmt.Sprintf("%s.%s: error: %v", r.Package, r.Name, r.Error))
		case r.Fail:
			failures = append(failures, fmt.Sprintf("%s.%s: fail", r.Package, r.Name))
		case r.Skip:
		default:
			passed++
		}
	}
	return passed, failures, nil
}
