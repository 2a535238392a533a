package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestToolsSeedForm: a manifest in the specification's form (seed 002,
// 5.2.1) registers as written and its tool runs through the pipeline;
// tools get --format seed prints it back as written, and that registers
// too; a manifest naming one thing in both forms is refused naming both
// members, and nothing is registered.
func TestToolsSeedForm(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	const file = "../../examples/seed-manifest.json"
	written, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if r := tg(t, "", s.flags("tools", "register", file)...); r.code != exitOK || !strings.Contains(r.stdout, "registered text.shout@1.2.0") {
		t.Fatalf("register: exit %d %s%s", r.code, r.stdout, r.stderr)
	}
	waitFor(t, "the seed-form tool to run", func() bool {
		r := tg(t, "", s.flags("invoke", "text.shout", "--params", `{"message":"m"}`, "--wait")...)
		return r.code == exitOK && strings.Contains(r.stdout, `"message": "m"`)
	})

	r := tg(t, "", s.flags("tools", "get", "text.shout", "--format", "seed")...)
	if r.code != exitOK {
		t.Fatalf("get --format seed: exit %d %s", r.code, r.stderr)
	}
	var printed, want map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &printed); err != nil {
		t.Fatalf("get --format seed: %v\n%s", err, r.stdout)
	}
	_ = json.Unmarshal(written, &want)
	// The registry stamps when it registered the version.
	ext, _ := printed["x-toolgate"].(map[string]any)
	if _, ok := ext["lifecycle"]; !ok {
		t.Fatalf("no registration stamps in x-toolgate: %s", r.stdout)
	}
	delete(ext, "lifecycle")
	if !reflect.DeepEqual(printed, want) {
		t.Fatalf("get --format seed is not the manifest as written:\n%s", r.stdout)
	}
	again := filepath.Join(t.TempDir(), "again.json")
	if err := os.WriteFile(again, []byte(strings.Replace(tg(t, "", s.flags("tools", "get", "text.shout", "--format", "seed")...).stdout,
		`"version": "1.2.0"`, `"version": "1.3.0"`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := tg(t, "", s.flags("tools", "register", again)...); r.code != exitOK || !strings.Contains(r.stdout, "registered text.shout@1.3.0") {
		t.Fatalf("registering the printed form: exit %d %s%s", r.code, r.stdout, r.stderr)
	}
	if r := tg(t, "", s.flags("tools", "get", "text.shout", "--format", "yaml")...); r.code != exitUsage {
		t.Fatalf("--format yaml: exit %d", r.code)
	}

	mixed := filepath.Join(t.TempDir(), "mixed.json")
	doc := strings.Replace(strings.Replace(string(written), `"text.shout"`, `"text.mixed"`, 1),
		`"limits": {"pids": 8}`, `"limits": {"pids": 8, "timeout_ms": 5000}`, 1)
	if err := os.WriteFile(mixed, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	r = tg(t, "", s.flags("tools", "register", mixed, "--json")...)
	if r.code != exitError || !strings.Contains(r.stdout+r.stderr, "E3008") ||
		!strings.Contains(r.stdout+r.stderr, "/x-toolgate/limits/timeout_ms") || !strings.Contains(r.stdout+r.stderr, "/execution_config/default_timeout_seconds") {
		t.Fatalf("mixed forms: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := tg(t, "", s.flags("tools", "get", "text.mixed")...); r.code != exitError || !strings.Contains(r.stderr, "E3001") {
		t.Fatalf("the refused manifest was registered: exit %d %s", r.code, r.stdout)
	}

	// The specification's registration codes: an invalid breaker
	// configuration (E3403), strict validation without a result schema
	// (E3508); neither is registered.
	refusals := []struct {
		ecode, loc string
		edit       func(d map[string]any)
	}{
		{"E3403", "/execution_config/circuit_breaker_config/failure_rate_threshold", func(d map[string]any) {
			d["execution_config"].(map[string]any)["circuit_breaker_config"].(map[string]any)["failure_rate_threshold"] = 150
		}},
		{"E3508", "/result_schema", func(d map[string]any) {
			delete(d, "result_schema")
			d["x-toolgate"].(map[string]any)["output_policy"] = map[string]any{"mode": "strict"}
		}},
	}
	for _, c := range refusals {
		var d map[string]any
		_ = json.Unmarshal(written, &d)
		d["tool_id"] = "text.refused"
		c.edit(d)
		doc, _ := json.Marshal(d)
		f := filepath.Join(t.TempDir(), "refused.json")
		if err := os.WriteFile(f, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		r := tg(t, "", s.flags("tools", "register", f)...)
		if r.code != exitError || !strings.Contains(r.stderr, c.ecode) || !strings.Contains(r.stderr, c.loc) {
			t.Fatalf("%s: exit %d\n%s%s", c.ecode, r.code, r.stdout, r.stderr)
		}
		if r := tg(t, "", s.flags("tools", "get", "text.refused")...); r.code != exitError || !strings.Contains(r.stderr, "E3001") {
			t.Fatalf("%s: the refused manifest was registered: %s", c.ecode, r.stdout)
		}
	}
}
