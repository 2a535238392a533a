package kinds_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/schemas"
	"github.com/toolgate/toolgate/stages/execute"
	"github.com/toolgate/toolgate/stages/execute/builtin"
	"github.com/toolgate/toolgate/stages/execute/kind"
	"github.com/toolgate/toolgate/stages/execute/kinds"
)

// TestSchemaNamesTheCompiledKinds: the manifest schema's kind enum is the
// list of kinds compiled in, and each has its configuration member: a kind
// added to one and not the other fails here.
func TestSchemaNamesTheCompiledKinds(t *testing.T) {
	s := schemas.Manifest()
	var enum []string
	for _, v := range s.Properties["kind"].Enum {
		enum = append(enum, fmt.Sprint(v))
	}
	names := kinds.Compiled().Names()
	slices.Sort(enum)
	slices.Sort(names)
	if !slices.Equal(enum, names) {
		t.Fatalf("schemas/tool-manifest.schema.json names kinds %v, stages/execute/kinds compiles %v", enum, names)
	}
	for _, n := range names {
		if s.Properties[n] == nil {
			t.Errorf("the manifest schema has no %q member to configure kind %s", n, n)
		}
	}
}

// TestEveryKindIsInstalled: an executor given the compiled kinds runs each
// one it does not run itself.
func TestEveryKindIsInstalled(t *testing.T) {
	x := execute.New(tools.NewRegistry(), builtin.New(builtin.Env{}), nil, nil)
	var stops int
	if err := x.Install(kinds.Compiled(), &kind.Deps{OnStop: func(func()) { stops++ }}); err != nil {
		t.Fatal(err)
	}
	for _, k := range kinds.Compiled().All() {
		if got := x.Kind(k.Name); (got != nil) != (k.New != nil) {
			t.Errorf("kind %s: runner %T, constructor %v", k.Name, got, k.New != nil)
		}
	}
	if stops == 0 {
		t.Error("no kind asked to release anything (the http kind's connections, the mcp kind's servers)")
	}
}

// TestCheckRunsTheKindsValidate: registration hands a kind its own
// configuration member, and refuses what it refuses with the field named.
func TestCheckRunsTheKindsValidate(t *testing.T) {
	m, err := tools.Parse([]byte(`{"id":"get","name":"get","version":"1.0.0","description":"gets","kind":"http",
		"http":{"url":"http://plain.example.com/"},"input_schema":{"type":"object"}}`))
	if err != nil {
		t.Fatal(err)
	}
	var seen json.RawMessage
	strict := kind.NewRegistry(kind.Kind{Name: "http", Validate: func(spec json.RawMessage) error {
		seen = spec
		var s struct{ URL string }
		if err := json.Unmarshal(spec, &s); err != nil {
			return err
		}
		if !strings.HasPrefix(s.URL, "https:") {
			return errors.New("only https here")
		}
		return nil
	}})
	err = strict.Check(m)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.ECode != api.EInvalidManifest || len(ae.Fields) != 1 || ae.Fields[0].Location != "/http" {
		t.Fatalf("got %v, want E3008 at /http", err)
	}
	if string(seen) != `{"url":"http://plain.example.com/"}` {
		t.Fatalf("Validate saw %s", seen)
	}
	if err := kinds.Compiled().Check(m); err != nil {
		t.Fatalf("the compiled kinds: %v", err)
	}
}

func TestRegisterRefusesTwins(t *testing.T) {
	r := kind.NewRegistry(kinds.Builtin)
	if err := r.Register(kind.Kind{Name: "builtin"}); err == nil {
		t.Fatal("a second builtin kind was registered")
	}
	if err := r.Register(kind.Kind{}); err == nil {
		t.Fatal("an unnamed kind was registered")
	}
	if _, err := kinds.Compiled().With(kind.Kind{Name: "http"}); err == nil {
		t.Fatal("With let a second http kind in")
	}
}
