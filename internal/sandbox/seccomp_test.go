package sandbox

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestSeccompDeniesDangerousSyscalls: inside the sandbox, unshare (a fresh
// user namespace) and mount fail with EPERM, while ordinary tools run.
func TestSeccompDeniesDangerousSyscalls(t *testing.T) {
	cfg := requireSandbox(t)
	for _, c := range []struct{ name, script string }{
		{"unshare -U", `unshare -U true`},
		{"unshare -m", `unshare -m true`},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := Run(context.Background(), cfg, Spec{Argv: []string{"sh", "-c", c.script},
				Limits: Limits{Wall: 10 * time.Second}})
			if err == nil {
				t.Fatalf("%s ran: %s", c.script, res.Stdout)
			}
			if !strings.Contains(string(res.Stderr), "Operation not permitted") {
				t.Fatalf("%s: %v; stderr %q, want EPERM", c.script, err, res.Stderr)
			}
		})
	}
	res, err := Run(context.Background(), cfg, Spec{Argv: []string{"sh", "-c", `ls /usr/bin >/dev/null && sort </dev/null && echo '{"ok":true}'`},
		Limits: Limits{Wall: 10 * time.Second}})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != `{"ok":true}` {
		t.Fatalf("an ordinary tool: %v %s %s", err, res.Stdout, res.Stderr)
	}
}

func TestSeccompProgramAssembles(t *testing.T) {
	prog, err := seccompProgram()
	if err != nil || len(prog) == 0 || len(prog)%8 != 0 {
		t.Fatalf("%d bytes, %v", len(prog), err)
	}
}
