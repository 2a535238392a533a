package node_test

import (
	"fmt"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/topology"
	"os"
	"path/filepath"
	"testing"
)

// gitLike is a cli tool that, like git clone, runs the command of an
// --upload-pack=CMD option among its arguments.
func gitLike(id, cliExtra, extra string) string {
	script := `for a; do case "$a" in --upload-pack=*) sh -c "${a#--upload-pack=}";; esac; done; printf '{"args":%d}' $#`
	return fmt.Sprintf(`{"id":%q,"name":"git-like","version":"1.0.0","description":"clones a repository","kind":"cli",
	  "cli":{"command":["sh","-c",%q,"git","clone","{{repo}}"],"stdin":"none"%s},%s
	  "input_schema":{"type":"object","required":["repo"],"properties":{"repo":{"type":"string"}}},
	  "output_schema":{"type":"object"},
	  "permissions":{"filesystem":[{"path":"/data","mode":"rw"}]}}`, id, script, cliExtra, extra)
}

// TestCLIOperandOptionInjection: a parameter the manifest marks as an
// operand cannot become an option of the command, and the shell input check
// flags a leading-dash option on its own.
func TestCLIOperandOptionInjection(t *testing.T) {
	e, n, root := sandboxEnv(t, topology.TopologyOptions{})
	registerTools(t, n,
		gitLike("test.git_operand", `,"operands":["repo"]`, ""),
		gitLike("test.git_checked", "", `"input_checks":{"/repo":["shell"]},`),
		gitLike("test.git_plain", "", ""),
	)
	pwned := filepath.Join(root, "data", "pwned")
	hostile := `--upload-pack=touch /files/data/pwned;`
	for _, id := range []string{"test.git_operand", "test.git_checked"} {
		t.Run(id, func(t *testing.T) {
			e.t = t
			resp := e.invoke(request("opinj", id, mustJSON(t, map[string]string{"repo": hostile})))
			if resp.Status != api.StatusError || resp.Error == nil || resp.Error.ECode != api.EInputRuleFired ||
				resp.Error.Details["rule"] != "shell.option_injection" {
				t.Fatalf("got %s %s, want E3018 shell.option_injection", resp.Status, mustJSON(t, resp.Error))
			}
			if _, err := os.Stat(pwned); err == nil {
				t.Fatal("the option ran its command")
			}
		})
	}
	e.t = t
	// Without either, the attack works: what the two defences stop.
	if resp := e.invoke(request("opinj", "test.git_plain", mustJSON(t, map[string]string{"repo": hostile}))); resp.Status != api.StatusSuccess {
		t.Fatalf("plain: %s %s", resp.Status, mustJSON(t, resp.Error))
	}
	if _, err := os.Stat(pwned); err != nil {
		t.Fatalf("the unprotected tool did not run the option's command: %v", err)
	}
	if resp := e.invoke(request("opinj", "test.git_operand", `{"repo":"https://example.com/r.git"}`)); resp.Status != api.StatusSuccess {
		t.Fatalf("an ordinary operand: %s %s", resp.Status, mustJSON(t, resp.Error))
	}
}
