package client_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// nonStdDeps lists the packages outside the standard library that pkgs
// depend on, themselves included.
func nonStdDeps(t *testing.T, pkgs ...string) []string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list dependencies with")
	}
	args := append([]string{"list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}"}, pkgs...)
	out, err := exec.Command(gobin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	return strings.Fields(string(out))
}

// TestClientDependsOnlyOnAPISubjectsAndNATS: the SDK is what users import;
// it must not drag in toolgate's internals or anything beyond the public
// wire types, the subject names and nats.go (with what nats.go needs).
func TestClientDependsOnlyOnAPISubjectsAndNATS(t *testing.T) {
	allowed := nonStdDeps(t, "github.com/nats-io/nats.go", "github.com/nats-io/nats.go/jetstream", "github.com/nats-io/nats.go/micro")
	allowed = append(allowed,
		"github.com/toolgate/toolgate/api",
		"github.com/toolgate/toolgate/subjects",
		"github.com/toolgate/toolgate/client")
	for _, dep := range nonStdDeps(t, "github.com/toolgate/toolgate/client") {
		if !slices.Contains(allowed, dep) {
			t.Errorf("client depends on %s", dep)
		}
	}
}
