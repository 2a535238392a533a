package secrets

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestLookupFilesThenEnvironment(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "crm.token"), []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"TOOLGATE_SECRET_CRM_TOKEN": "from-env", "TOOLGATE_SECRET_ONLY_ENV": "env-value"}
	s := &Source{Dir: dir, LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}
	for name, want := range map[string]string{"crm.token": "from-file", "only-env": "env-value"} {
		got, err := s.Lookup(name)
		if err != nil || got != want {
			t.Errorf("Lookup(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	if _, err := s.Lookup("missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Lookup(missing) = %v, want ErrNotFound", err)
	}
	// Without a directory the environment still answers.
	if got, err := (&Source{LookupEnv: s.LookupEnv}).Lookup("crm.token"); err != nil || got != "from-env" {
		t.Errorf("env only: %q, %v", got, err)
	}
}

func TestLookupRefusesPathTricks(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "secrets")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(parent, "outside"), []byte("leak"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(parent, "outside"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	s := &Source{Dir: dir, LookupEnv: func(string) (string, bool) { return "", false }}
	for _, name := range []string{"../outside", "/etc/passwd", "..", ".", "a/b", "", ".hidden", "a\x00b", "a b"} {
		if _, err := s.Lookup(name); !errors.Is(err, ErrInvalidName) {
			t.Errorf("Lookup(%q) = %v, want ErrInvalidName", name, err)
		}
	}
	// A link out of the directory is not followed.
	if v, err := s.Lookup("link"); err == nil {
		t.Errorf("Lookup(link) = %q, want an error", v)
	}
}

func TestLookupRefusesEmptyAndHugeFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "empty"), []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "huge"), make([]byte, MaxBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &Source{Dir: dir, LookupEnv: func(string) (string, bool) { return "", false }}
	if _, err := s.Lookup("empty"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Lookup(empty) = %v, want ErrNotFound", err)
	}
	if _, err := s.Lookup("huge"); err == nil {
		t.Error("a file over MaxBytes was accepted")
	}
}

func TestEnvName(t *testing.T) {
	if got := EnvName("crm.api-key"); got != "TOOLGATE_SECRET_CRM_API_KEY" {
		t.Fatalf("EnvName = %q", got)
	}
}

// TestLookupUnreachableDirectory: a secrets directory that cannot be opened
// makes a secret the environment lacks unreachable, not missing; the
// environment still answers for the secrets it holds.
func TestLookupUnreachableDirectory(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(k string) (string, bool) { return "env-value", k == "TOOLGATE_SECRET_IN_ENV" }
	for _, dir := range []string{notDir, filepath.Join(t.TempDir(), "gone")} {
		s := &Source{Dir: dir, LookupEnv: env}
		if _, err := s.Lookup("api.key"); !errors.Is(err, ErrUnreachable) || errors.Is(err, ErrNotFound) {
			t.Errorf("%s: %v, want ErrUnreachable", dir, err)
		}
		if v, err := s.Lookup("in-env"); err != nil || v != "env-value" {
			t.Errorf("%s: the environment's secret: %q %v", dir, v, err)
		}
	}
	if _, err := (&Source{Dir: t.TempDir(), LookupEnv: env}).Lookup("api.key"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a readable directory without the secret: %v, want ErrNotFound", err)
	}
}
