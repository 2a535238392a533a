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
	// .ci/run installs the package of each command it lacks: gcc's among
	// them, and the list is what apt-get installs.
	if !regexp.MustCompile(`(?m)^for need in .*\bgcc:gcc\b`).Match(ci) ||
		!regexp.MustCompile(`(?m)^\s*\$SUDO apt-get install .*"\$\{pkgs\[@\]\}"`).Match(ci) {
		t.Error(".ci/run does not install gcc")
	}
}
