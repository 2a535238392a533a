package stages_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStagesDoNotCallBackIntoTheRunner: the runner drives stages; a stage,
// and the breaker execute embeds, builds its outputs with this package and
// never imports the runner, directly or through another package.
func TestStagesDoNotCallBackIntoTheRunner(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list dependencies with")
	}
	pkgs := []string{"github.com/toolgate/toolgate/stages/...", "github.com/toolgate/toolgate/internal/breaker"}
	out, err := exec.Command(gobin, append([]string{"list", "-f", `{{.ImportPath}}: {{join .Deps " "}}`}, pkgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, ": ")
		for _, d := range strings.Fields(deps) {
			if d == "github.com/toolgate/toolgate/internal/runner" {
				t.Errorf("%s depends on internal/runner", pkg)
			}
		}
	}
}
