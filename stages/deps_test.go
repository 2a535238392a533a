package stages_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestContractImportsNoTransport: the Stage contract is logic only; NATS,
// OpenTelemetry and Prometheus belong to the runner that drives stages.
func TestContractImportsNoTransport(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list dependencies with")
	}
	out, err := exec.Command(gobin, "list", "-deps", "github.com/toolgate/toolgate/stages").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/nats-io/", "go.opentelemetry.io/", "github.com/prometheus/"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("stages depends on %s", dep)
			}
		}
	}
}
