package tools

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
)

func seedDoc(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("../../examples/seed-manifest.json")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// editJSON returns doc with edit applied to its map form.
func editJSON(t *testing.T, doc []byte, edit func(m map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(doc, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(x, y)
}

// TestSeedFormParses: each member of the specification's form means what
// the specification says, as the toolgate member it maps onto.
func TestSeedFormParses(t *testing.T) {
	m := mustParse(t, seedDoc(t))
	if m.ID != "text.shout" || m.Name != "Shout" || m.Version != "1.2.0" || m.Category != "computation" ||
		m.Description != "Returns the message it is given." || m.Kind != "builtin" || m.Builtin.Function != "echo" {
		t.Errorf("identity: %+v", m)
	}
	if m.Timeout() != 5*time.Second || m.Limits.CPUMillicores != 500 || m.Limits.MemoryMB != 256 || m.Limits.PIDs != 8 {
		t.Errorf("limits: %+v", m.Limits)
	}
	if m.Safety.RequiresApproval || !m.Safety.Idempotent || m.Safety.RiskLevel != "low" {
		t.Errorf("safety: %+v", m.Safety)
	}
	if r := m.RetryPolicy; r == nil || r.MaxAttempts != 3 || r.BaseDelayMS != 100 || r.MaxDelayMS != 2000 || !reflect.DeepEqual(r.RetryableErrors, []string{"timeout"}) {
		t.Errorf("retry policy: %+v", r)
	}
	if c := m.CircuitBreaker; c == nil || c.FailureRateThreshold != 50 || c.SlidingWindowSize != 10 || c.WaitDurationSeconds != 30 {
		t.Errorf("circuit breaker: %+v", c)
	}
	if len(m.Permissions.Filesystem) != 1 || m.Permissions.Filesystem[0] != (FilesystemPermission{Path: ".", Mode: "ro"}) {
		t.Errorf("permissions: %+v", m.Permissions)
	}
	if f, _ := m.ValidateInput([]byte(`{}`)); !hasField(f, "/", "message") {
		t.Errorf("parameters_schema is not the input schema: %v", f)
	}
	if f, _ := m.ValidateOutput([]byte(`{"message":1}`)); len(f) == 0 {
		t.Error("result_schema is not the output schema")
	}
	approval := mustParse(t, editJSON(t, seedDoc(t), func(d map[string]any) {
		d["execution_config"].(map[string]any)["requires_approval"] = true
	}))
	if !approval.Safety.RequiresApproval || !approval.Safety.Idempotent {
		t.Errorf("requires_approval: %+v", approval.Safety)
	}
}

// TestSeedFormRoundTrip: a manifest written in the specification's form,
// kept in toolgate's and written back, is what the author wrote; a native
// manifest written in the specification's form parses as the same tool.
func TestSeedFormRoundTrip(t *testing.T) {
	doc := seedDoc(t)
	native, err := Native(doc)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(native), "tool_id") || strings.Contains(string(native), SeedExtension) {
		t.Fatalf("not converted: %s", native)
	}
	back, err := SeedForm(native)
	if err != nil {
		t.Fatal(err)
	}
	if !sameJSON(t, back, doc) {
		t.Fatalf("round trip changed the manifest:\n%s\nwant\n%s", back, doc)
	}
	// Every example, and a timeout in milliseconds whole seconds cannot
	// say, survive the trip.
	ms, err := Examples()
	if err != nil {
		t.Fatal(err)
	}
	odd := manifestJSON(t, func(m map[string]any) {
		m["limits"] = map[string]any{"timeout_ms": 1500, "memory_mb": 64}
		m["safety"] = map[string]any{"requires_approval": true, "approvers": 2}
	})
	docs := [][]byte{odd}
	for _, m := range ms {
		b, _ := json.Marshal(m)
		docs = append(docs, b)
	}
	for _, d := range docs {
		want := mustParse(t, d)
		seed, err := SeedForm(d)
		if err != nil {
			t.Fatalf("%s: %v", want.Key(), err)
		}
		got := mustParse(t, seed)
		if !sameManifest(want, got) {
			t.Errorf("%s: differs after the specification's form:\n%s", want.Key(), seed)
		}
	}
	seed, _ := SeedForm(odd)
	if !strings.Contains(string(seed), `"limits":{"timeout_ms":1500}`) || !strings.Contains(string(seed), `"default_memory_mb_limit":64`) {
		t.Errorf("sub-second timeout: %s", seed)
	}
}

// TestSeedFormMixing: one thing named in both forms is refused naming both
// members; so is a member of toolgate's form outside x-toolgate, and one
// the specification names inside it.
func TestSeedFormMixing(t *testing.T) {
	cases := []struct {
		name string
		edit func(d map[string]any)
		locs []string
	}{
		{"timeout in both forms", func(d map[string]any) {
			d["x-toolgate"].(map[string]any)["limits"] = map[string]any{"timeout_ms": 5000}
		}, []string{"/x-toolgate/limits/timeout_ms", "/execution_config/default_timeout_seconds"}},
		{"native limits beside execution_config", func(d map[string]any) {
			d["limits"] = map[string]any{"timeout_ms": 5000}
		}, []string{"/limits/timeout_ms", "/execution_config/default_timeout_seconds"}},
		{"id beside tool_id", func(d map[string]any) { d["id"] = "other" }, []string{"/id", "/tool_id"}},
		{"input_schema in the extension", func(d map[string]any) {
			d["x-toolgate"].(map[string]any)["input_schema"] = map[string]any{"type": "object"}
		}, []string{"/x-toolgate/input_schema", "/parameters_schema"}},
		{"approval in both", func(d map[string]any) {
			d["execution_config"].(map[string]any)["requires_approval"] = false
			d["x-toolgate"].(map[string]any)["safety"].(map[string]any)["requires_approval"] = true
		}, []string{"/x-toolgate/safety/requires_approval", "/execution_config/requires_approval"}},
		{"retry policy in the extension only", func(d map[string]any) {
			delete(d["execution_config"].(map[string]any), "retry_policy")
			d["x-toolgate"].(map[string]any)["retry_policy"] = map[string]any{"max_attempts": 2}
		}, []string{"/x-toolgate/retry_policy"}},
		{"kind outside the extension", func(d map[string]any) { d["kind"] = "builtin" }, []string{"/kind"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(editJSON(t, seedDoc(t), c.edit))
			var te *api.Error
			if !errors.As(err, &te) || te.ECode != api.EInvalidManifest {
				t.Fatalf("got %v, want E3008", err)
			}
			for _, loc := range c.locs {
				if !hasField(te.Fields, loc, "") {
					t.Errorf("no field error at %s: %+v", loc, te.Fields)
				}
			}
		})
	}
}

// TestSeedFormUnknownMember: a member neither form knows is refused at its
// own JSON path, wherever it stands; a field error in a converted member
// points at the member as written.
func TestSeedFormUnknownMember(t *testing.T) {
	cases := []struct {
		name string
		edit func(d map[string]any)
		loc  string
	}{
		{"top level", func(d map[string]any) { d["owner"] = "me" }, "/owner"},
		{"execution_config", func(d map[string]any) { d["execution_config"].(map[string]any)["owner"] = "me" }, "/execution_config/owner"},
		{"x-toolgate", func(d map[string]any) { d["x-toolgate"].(map[string]any)["owner"] = "me" }, "/x-toolgate/owner"},
		{"x-toolgate safety", func(d map[string]any) {
			d["x-toolgate"].(map[string]any)["safety"].(map[string]any)["owner"] = "me"
		}, "/x-toolgate/safety/owner"},
		{"circuit breaker", func(d map[string]any) {
			d["execution_config"].(map[string]any)["circuit_breaker_config"].(map[string]any)["owner"] = "me"
		}, "/execution_config/circuit_breaker_config/owner"},
		{"parameters schema", func(d map[string]any) { d["parameters_schema"] = map[string]any{"type": "nonsense"} }, "/parameters_schema/type"},
		{"version", func(d map[string]any) { d["version"] = "one" }, "/version"},
		{"timeout over the limit", func(d map[string]any) {
			d["execution_config"].(map[string]any)["default_timeout_seconds"] = 7200
		}, "/execution_config/default_timeout_seconds"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(editJSON(t, seedDoc(t), c.edit))
			var te *api.Error
			if !errors.As(err, &te) || te.ECode != api.EInvalidManifest || !hasField(te.Fields, c.loc, "") {
				t.Fatalf("got %v %+v, want E3008 at %s", err, api.AsError(err).Fields, c.loc)
			}
		})
	}
}

// TestSeedCodesAtRegistration: an invalid breaker configuration alone is
// the specification's E3403, in either form; strict result validation
// without a result schema is E3508.
func TestSeedCodesAtRegistration(t *testing.T) {
	cases := []struct {
		name  string
		doc   []byte
		ecode string
		loc   string
	}{
		{"threshold over 100", manifestJSON(t, func(m map[string]any) {
			m["circuit_breaker"] = map[string]any{"failure_rate_threshold": 150}
		}), api.EBreakerConfig, "/circuit_breaker/failure_rate_threshold"},
		{"window under 1, seed form", editJSON(t, seedDoc(t), func(d map[string]any) {
			d["execution_config"].(map[string]any)["circuit_breaker_config"].(map[string]any)["sliding_window_size"] = 0
		}), api.EBreakerConfig, "/execution_config/circuit_breaker_config/sliding_window_size"},
		{"a bad breaker and another problem", manifestJSON(t, func(m map[string]any) {
			m["circuit_breaker"] = map[string]any{"failure_rate_threshold": 150}
			m["owner"] = "me"
		}), api.EInvalidManifest, "/circuit_breaker/failure_rate_threshold"},
		{"strict without an output schema", manifestJSON(t, func(m map[string]any) {
			delete(m, "output_schema")
			m["output_policy"] = map[string]any{"mode": "strict"}
		}), api.EResultSchemaMissing, "/output_schema"},
		{"strict without a result schema, seed form", editJSON(t, seedDoc(t), func(d map[string]any) {
			delete(d, "result_schema")
			d["x-toolgate"].(map[string]any)["output_policy"] = map[string]any{"mode": "strict"}
		}), api.EResultSchemaMissing, "/result_schema"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.doc)
			var te *api.Error
			if !errors.As(err, &te) || te.ECode != c.ecode || te.Code != api.InvalidParameters || !hasField(te.Fields, c.loc, "") {
				t.Fatalf("got %v %+v, want %s at %s", err, api.AsError(err).Fields, c.ecode, c.loc)
			}
		})
	}
	// Without output_policy, or lenient, a tool needs no output schema.
	for _, pol := range []any{nil, map[string]any{"mode": "lenient"}} {
		mustParse(t, manifestJSON(t, func(m map[string]any) {
			delete(m, "output_schema")
			if pol != nil {
				m["output_policy"] = pol
			}
		}))
	}
}

// TestSeedFormExtensionNotAnObject: an x-toolgate member of the wrong type
// is refused, not overwritten by the specification's members.
func TestSeedFormExtensionNotAnObject(t *testing.T) {
	_, err := Parse(editJSON(t, seedDoc(t), func(d map[string]any) { d["x-toolgate"].(map[string]any)["limits"] = "small" }))
	var te *api.Error
	if !errors.As(err, &te) || te.ECode != api.EInvalidManifest || !hasField(te.Fields, "/x-toolgate/limits", "") {
		t.Fatalf("got %v %+v, want E3008 at /x-toolgate/limits", err, api.AsError(err).Fields)
	}
}

// TestSeedFormSite: a manifest's site survives the specification's form,
// where it is one of toolgate's members in x-toolgate.
func TestSeedFormSite(t *testing.T) {
	ms, err := Examples()
	if err != nil {
		t.Fatal(err)
	}
	m := ms[0]
	m.Site = "lab-eu"
	doc, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := SeedForm(doc)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(seed), `"x-toolgate":{`) || !strings.Contains(string(seed), `"site":"lab-eu"`) {
		t.Fatalf("the specification's form: %s", seed)
	}
	if got := mustParse(t, seed); got.Site != "lab-eu" {
		t.Fatalf("site after the specification's form: %q", got.Site)
	}
	bad := strings.Replace(string(doc), `"site":"lab-eu"`, `"site":"lab.eu"`, 1)
	if _, err := Parse([]byte(bad)); err == nil {
		t.Fatal("a site named lab.eu was accepted")
	}
}
