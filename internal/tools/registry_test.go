package tools

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/Masterminds/semver/v3"
	"github.com/toolgate/toolgate/api"
)

// version returns a parsed manifest of tool id at version in state.
func version(t testing.TB, id, v, state string) *Manifest {
	t.Helper()
	return mustParse(t, manifestJSON(t, func(m map[string]any) {
		m["id"] = id
		m["version"] = v
		if state != "" {
			m["lifecycle"] = map[string]any{"state": state}
		}
	}))
}

// testRegistry holds tool "t" in every lifecycle state, tool "gone" with
// nothing servable, and tool "pre" with only a pre-release.
func testRegistry(t testing.TB) *Registry {
	r := NewRegistry()
	// Out of order on purpose: Put keeps them sorted.
	for _, m := range []*Manifest{
		version(t, "t", "2.1.0", StateRemoved),
		version(t, "t", "1.0.0", ""),
		version(t, "t", "1.3.0-beta.1", StateActive),
		version(t, "t", "0.9.0", StateActive),
		version(t, "t", "1.2.0", StateRemoved),
		version(t, "t", "2.0.0", StateSunset),
		version(t, "t", "1.1.0", StateDeprecated),
		version(t, "gone", "1.0.0", StateRemoved),
		version(t, "gone", "1.1.0", StateSunset),
		version(t, "pre", "0.1.0-alpha", StateActive),
		version(t, "dep", "1.0.0", StateDeprecated),
		version(t, "dep", "1.1.0", StateDeprecated),
		version(t, "dep", "1.2.0", StateSunset),
		version(t, "timed", "1.0.0", StateActive),
		dated(version(t, "timed", "2.0.0", StateActive), func(l *Lifecycle) { l.SunsetAt = time.Now().Add(-time.Minute) }),
		version(t, "timed2", "1.0.0", StateActive),
		dated(version(t, "timed2", "2.0.0", StateActive), func(l *Lifecycle) { l.DeprecationDate = time.Now().Add(-time.Minute) }),
	} {
		r.Put(m)
	}
	return r
}

func dated(m *Manifest, set func(*Lifecycle)) *Manifest {
	set(&m.Lifecycle)
	return m
}

// TestLifecycleDates: dates in the future change nothing; once they pass,
// the version moves on without anyone writing to it.
func TestLifecycleDates(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m := version(t, "x", "2.0.0", StateActive)
	m.Lifecycle.DeprecationDate = now.Add(time.Hour)
	m.Lifecycle.SunsetAt = now.Add(2 * time.Hour)
	r := NewRegistry()
	r.Put(version(t, "x", "1.0.0", StateActive))
	r.Put(m)
	for _, tc := range []struct {
		at          time.Duration
		state, want string
	}{
		{0, StateActive, "2.0.0"},
		{time.Hour, StateDeprecated, "1.0.0"},
		{2 * time.Hour, StateSunset, "1.0.0"},
	} {
		at := now.Add(tc.at)
		r.Now = func() time.Time { return at }
		if got := m.State(at); got != tc.state {
			t.Errorf("at +%v: state %s, want %s", tc.at, got, tc.state)
		}
		got, err := r.Resolve("x", "")
		if err != nil || got.Version != tc.want {
			t.Errorf("at +%v: latest = %v, %v; want %s", tc.at, got, err, tc.want)
		}
	}
	removed := version(t, "x", "3.0.0", StateRemoved)
	removed.Lifecycle.SunsetAt = now
	if removed.State(now.Add(time.Hour)) != StateRemoved {
		t.Error("a removed version came back as sunset")
	}
}

func TestResolve(t *testing.T) {
	r := testRegistry(t)
	tests := []struct {
		name, id, constraint string
		want                 string // version, or "" for an error
		err                  *api.Error
		ecode                string
	}{
		{"latest prefers active to a higher deprecated", "t", "latest", "1.0.0", nil, ""},
		{"empty means latest", "t", "", "1.0.0", nil, ""},
		{"latest deprecated when none is active", "dep", "", "1.1.0", nil, ""},
		{"latest skips a passed sunset_at", "timed", "", "1.0.0", nil, ""},
		{"latest skips a passed deprecation_date", "timed2", "", "1.0.0", nil, ""},
		{"exact version past its sunset_at", "timed", "2.0.0", "2.0.0", nil, ""},
		{"latest pre-release only", "pre", "", "0.1.0-alpha", nil, ""},
		{"latest when all removed or sunset", "gone", "latest", "", api.ErrToolVersionNotFound, api.EToolRemoved},
		{"exact active", "t", "1.0.0", "1.0.0", nil, ""},
		{"exact deprecated", "t", "1.1.0", "1.1.0", nil, ""},
		{"exact removed", "t", "1.2.0", "1.2.0", nil, ""},
		{"exact sunset", "t", "2.0.0", "2.0.0", nil, ""},
		{"exact pre-release", "t", "1.3.0-beta.1", "1.3.0-beta.1", nil, ""},
		{"unknown exact version", "t", "3.0.0", "", api.ErrToolVersionNotFound, api.EVersionNotFound},
		{"caret skips removed", "t", "^1.0", "1.1.0", nil, ""},
		{"tilde", "t", "~1.0.0", "1.0.0", nil, ""},
		{"comma range", "t", ">=1, <2", "1.1.0", nil, ""},
		{"x range", "t", "1.x", "1.1.0", nil, ""},
		{"v prefix is a range", "t", "v1.0.0", "1.0.0", nil, ""},
		{"range including pre-releases", "t", ">=1.3.0-0", "1.3.0-beta.1", nil, ""},
		{"range of sunset and removed", "t", "^2", "", api.ErrToolVersionNotFound, api.EVersionUnsatisfied},
		{"exact via range excludes removed", "t", "=1.2.0", "", api.ErrToolVersionNotFound, api.EVersionUnsatisfied},
		{"unsatisfiable range", "t", ">=5", "", api.ErrToolVersionNotFound, api.EVersionUnsatisfied},
		{"bad constraint", "t", "newest", "", api.ErrInvalidParameters, api.EVersionUnsatisfied},
		{"unknown id", "nope", "", "", api.ErrToolNotFound, api.EToolNotFound},
		{"unknown id beats bad constraint", "nope", "!!", "", api.ErrToolNotFound, api.EToolNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := r.Resolve(tt.id, tt.constraint)
			if tt.err == nil {
				if err != nil {
					t.Fatalf("Resolve(%q, %q): %v", tt.id, tt.constraint, err)
				}
				if m.ID != tt.id || m.Version != tt.want {
					t.Fatalf("Resolve(%q, %q) = %s, want version %s", tt.id, tt.constraint, m.Key(), tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("Resolve(%q, %q) = %s, want an error", tt.id, tt.constraint, m.Key())
			}
			if !errors.Is(err, tt.err) {
				t.Fatalf("error %v is not %s", err, tt.err.Code)
			}
			var te *api.Error
			if !errors.As(err, &te) || te.ECode != tt.ecode {
				t.Fatalf("error %v: ECode %q, want %q", err, te.ECode, tt.ecode)
			}
		})
	}
}

func TestVersionsListLen(t *testing.T) {
	r := testRegistry(t)
	var got []string
	for _, m := range r.Versions("t") {
		got = append(got, m.Version)
	}
	want := []string{"0.9.0", "1.0.0", "1.1.0", "1.2.0", "1.3.0-beta.1", "2.0.0", "2.1.0"}
	if !slices.Equal(got, want) {
		t.Errorf("Versions = %v, want %v", got, want)
	}
	if v := r.Versions("nope"); v != nil {
		t.Errorf("Versions(unknown) = %v", v)
	}

	got = nil
	for _, m := range r.List() {
		got = append(got, m.Key())
	}
	if want := []string{"dep@1.1.0", "pre@0.1.0-alpha", "t@1.0.0", "timed@1.0.0", "timed2@1.0.0"}; !slices.Equal(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
	if r.Len() != 17 {
		t.Errorf("Len = %d, want 17", r.Len())
	}
}

func TestPutReplacesAndDeleteRemoves(t *testing.T) {
	r := testRegistry(t)
	n := r.Len()

	repl := version(t, "t", "1.1.0", StateActive)
	r.Put(repl)
	if r.Len() != n {
		t.Fatalf("Len after replace = %d, want %d", r.Len(), n)
	}
	if m, _ := r.Resolve("t", "1.1.0"); m != repl {
		t.Fatal("Put did not replace 1.1.0")
	}

	r.Delete("t", "1.1.0")
	r.Delete("t", "9.9.9") // absent: no-op
	r.Delete("nope", "1.0.0")
	if r.Len() != n-1 {
		t.Fatalf("Len after delete = %d, want %d", r.Len(), n-1)
	}
	if m, err := r.Resolve("t", ""); err != nil || m.Version != "1.0.0" {
		t.Fatalf("latest after delete = %v, %v; want 1.0.0", m, err)
	}

	r.Delete("pre", "0.1.0-alpha")
	if _, err := r.Resolve("pre", ""); !errors.Is(err, api.ErrToolNotFound) {
		t.Fatalf("tool with no versions left: %v", err)
	}
	if slices.ContainsFunc(r.List(), func(m *Manifest) bool { return m.ID == "pre" }) {
		t.Fatal("List still has a deleted tool")
	}
}

func TestPutUnparsedManifest(t *testing.T) {
	r := NewRegistry()
	r.Put(&Manifest{ID: "x", Version: "1.0.0"})
	if m, err := r.Resolve("x", "^1"); err != nil || m.Version != "1.0.0" {
		t.Fatalf("Resolve = %v, %v", m, err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Put of a non-semver version did not panic")
		}
	}()
	r.Put(&Manifest{ID: "x", Version: "one"})
}

func TestRegistryConcurrent(t *testing.T) {
	r := testRegistry(t)
	ms := make([]*Manifest, 20)
	for i := range ms {
		ms[i] = version(t, "c", fmt.Sprintf("1.%d.0", i), "")
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i, m := range ms {
				if (i+w)%2 == 0 {
					r.Put(m)
				} else {
					r.Delete(m.ID, m.Version)
				}
			}
		})
		wg.Go(func() {
			for range 200 {
				m, err := r.Resolve("t", "^1")
				if err != nil {
					t.Error(err)
					return
				}
				if fields, err := m.ValidateInput([]byte(`{"a":1,"b":"x"}`)); err != nil || len(fields) != 1 {
					t.Errorf("ValidateInput: %v %v", fields, err)
					return
				}
				_, _ = r.Resolve("c", "")
				_ = r.List()
				_ = r.Versions("c")
				_ = r.Len()
			}
		})
	}
	wg.Wait()
}

func BenchmarkResolve(b *testing.B) {
	r := testRegistry(b)
	for _, c := range []string{"", "1.0.0", "^1.0"} {
		b.Run(fmt.Sprintf("%q", c), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.Resolve("t", c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func FuzzResolveConstraint(f *testing.F) {
	for _, s := range []string{"", "latest", "1.0.0", "1.2.0", "^1.2", "~1.0.3", ">=1, <2", "1.x", "*",
		">=1.3.0-0", "1.0.0 - 2.0.0", "^1 || ^2", "v1", "=1.0.0+meta", "!!", "1.0.0.0", "99999999999999999999.0.0"} {
		f.Add(s)
	}
	r := testRegistry(f)
	f.Fuzz(func(t *testing.T, c string) {
		m, err := r.Resolve("t", c)
		if err != nil {
			var te *api.Error
			if !errors.As(err, &te) {
				t.Fatalf("Resolve(%q): uncoded error %v", c, err)
			}
			switch {
			case te.Code == api.ToolVersionNotFound && (te.ECode == api.EVersionNotFound || te.ECode == api.EVersionUnsatisfied):
			case te.Code == api.InvalidParameters && te.ECode == api.EVersionUnsatisfied:
			default:
				t.Fatalf("Resolve(%q): unexpected error %v", c, err)
			}
			return
		}
		if c == "" || c == "latest" {
			return
		}
		if v, err := semver.StrictNewVersion(c); err == nil {
			if !v.Equal(m.ver) {
				t.Fatalf("exact %q resolved to %s", c, m.Key())
			}
			return
		}
		if !m.serving(time.Now()) {
			t.Fatalf("range %q resolved to %s in state %s", c, m.Key(), m.Lifecycle.State)
		}
	})
}

func FuzzParse(f *testing.F) {
	files, _ := exampleFS.ReadDir("examples")
	for _, file := range files {
		doc, _ := exampleFS.ReadFile("examples/" + file.Name())
		f.Add(doc)
	}
	f.Add(manifestJSON(f, nil))
	f.Add(manifestJSON(f, func(m map[string]any) {
		m["lifecycle"] = map[string]any{"state": "sunset", "sunset_at": "2030-06-01T12:00:00Z"}
		m["input_schema"] = map[string]any{"$defs": map[string]any{"a": map[string]any{"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
	}))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"id":"x","name":"x","version":"1.0.0","description":"","kind":"http","input_schema":{"$ref":"#"}}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		m, err := Parse(doc)
		if err != nil {
			if !errors.Is(err, api.ErrInvalidParameters) {
				t.Fatalf("Parse error is not invalid_parameters: %v", err)
			}
			return
		}
		// What Parse accepts must survive the store's marshal and re-parse.
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		again, err := Parse(b)
		if err != nil {
			t.Fatalf("re-parse of %s: %v", b, err)
		}
		if !sameManifest(m, again) {
			t.Fatalf("round trip changed the manifest:\n%s", b)
		}
		_, _ = m.ValidateInput(doc)
		_, _ = m.ValidateOutput(doc)
	})
}
