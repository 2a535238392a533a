package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestRequirementsNameTheRaceToolchain: make test runs with -race, which
// needs a C compiler: README's requirements name gcc, and .ci/run installs
// it on a fresh machine.
func TestRequirementsNameTheRaceToolchain(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, req, _ := strings.Cut(string(readme), "Requirements:")
	req, _, _ = strings.Cut(req, "\n\n")
	if !strings.Contains(req, "gcc") {
		t.Errorf("README's requirements do not name gcc:\n%s", req)
	}
	ci, err := os.ReadFile(filepath.Join("..", ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^\s*\$SUDO apt-get install .*\bgcc\b`).Match(ci) {
		t.Error(".ci/run does not install gcc")
	}
}
