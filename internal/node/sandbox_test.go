package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/stages/execute"
	"github.com/toolgate/toolgate/stages/execute/clitool"
	"github.com/toolgate/toolgate/subjects"
)

// cliTool is the manifest of a cli tool running script under sh, with the
// parameters' "arg" as $1 and the given limits and permissions (JSON
// fragments, may be empty).
func cliTool(id, script, limits, permissions string) string {
	doc := fmt.Sprintf(`{"id":%q,"name":%q,"version":"1.0.0","description":"sandboxed test tool","kind":"cli",
	  "cli":{"command":["sh","-c",%q,"sh","{{arg}}"],"stdin":"none"},
	  "input_schema":{"type":"object","properties":{"arg":{"type":"string"}}},"output_schema":{"type":"object"}`, id, id, script)
	if limits != "" {
		doc += `,"limits":` + limits
	}
	if permissions != "" {
		doc += `,"permissions":` + permissions
	}
	return doc + "}"
}

// sandboxEnv is a pipeline whose cli tools see fileRoot/data, read-write.
func sandboxEnv(t *testing.T, topo topology.TopologyOptions, stageNames ...string) (*env, *node.Node, string) {
	t.Helper()
	return sandboxEnvWith(t, topo, node.StageConfig{}, stageNames...)
}

// sandboxEnvWith is sandboxEnv with more of the stages' configuration.
func sandboxEnvWith(t *testing.T, topo topology.TopologyOptions, sc node.StageConfig, stageNames ...string) (*env, *node.Node, string) {
	t.Helper()
	if err := sandbox.Available(); err != nil {
		t.Fatalf("these tests need bubblewrap and prlimit (.ci/run installs them): %v", err)
	}
	root := t.TempDir()
	// Tools run as nobody when the tests run as root: the root must be
	// reachable, as in a deployment.
	_ = os.Chmod(filepath.Dir(root), 0o755)
	_ = os.Chmod(root, 0o755)
	if err := os.Mkdir(filepath.Join(root, "data"), 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(filepath.Join(root, "data"), 0o777)
	e := newEnv(t, topo)
	sc.Sandbox.FileRoot = root
	n := e.startPipeline(node.Config{Stages: stageNames, Stage: sc})
	return e, n, root
}

// TestCLIAttacksContained: each hostile cli tool ends with its code and one
// terminal audit event carrying it, leaves no process behind, touches
// nothing of the host, and the pipeline serves the next call.
func TestCLIAttacksContained(t *testing.T) {
	e, n, root := sandboxEnv(t, topology.TopologyOptions{})
	outside := t.TempDir()
	_ = os.Chmod(outside, 0o755)
	secret := filepath.Join(outside, "secret.txt")
	if err := os.WriteFile(secret, []byte("secret"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "data", "link")); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(e.url)
	if err != nil {
		t.Fatal(err)
	}
	rw := `{"filesystem":[{"path":"/data","mode":"rw"}]}`
	cases := []struct {
		name, script, limits, perms, arg string
		statuses                         []api.Status
		ecodes                           []string
		marker                           string
	}{
		{"fork bomb", `b() { b | b & }; b; sleep 30 # forkbomb-pipeline`, `{"timeout_ms":3000,"pids":32}`, "", "",
			[]api.Status{api.StatusError, api.StatusTimeout},
			[]string{api.EResourceLimit, api.EToolFailed, api.ESandboxCrashed, api.ETimeout}, "forkbomb-pipeline"},
		{"memory hog", `head -c 400000000 /dev/zero | tail -c 300000000 >/dev/null # memhog-pipeline`, `{"timeout_ms":10000,"memory_mb":64}`, "", "",
			[]api.Status{api.StatusError}, []string{api.EResourceLimit}, "memhog-pipeline"},
		{"busy loop past its CPU time", `while :; do :; done # cpu-pipeline`, `{"timeout_ms":10000,"cpu_seconds":1}`, "", "",
			[]api.Status{api.StatusError}, []string{api.EResourceLimit}, "cpu-pipeline"},
		{"sleeper past its wall time", `sleep 30 # sleeper-pipeline`, `{"timeout_ms":1000}`, "", "",
			[]api.Status{api.StatusTimeout}, []string{api.ETimeout}, "sleeper-pipeline"},
		{"100 MiB stdout flood", `head -c 104857600 /dev/zero # flood-pipeline`, `{"timeout_ms":10000,"output_bytes":1048576}`, "", "",
			[]api.Status{api.StatusError}, []string{api.EResourceLimit}, "flood-pipeline"},
		{"connects to the NATS port", `bash -c 'exec 3<>/dev/tcp/127.0.0.1/` + u.Port() + `' && echo '{"connected":true}'`, `{"timeout_ms":5000}`, "", "",
			[]api.Status{api.StatusError}, []string{api.EToolFailed}, ""},
		{"makes a user namespace (seccomp)", `unshare -U true && echo '{"escaped":true}'`, "", "", "",
			[]api.Status{api.StatusError}, []string{api.EToolFailed}, ""},
		{"reads /etc/shadow", `cat /etc/shadow && echo '{}'`, "", "", "",
			[]api.Status{api.StatusError}, []string{api.EToolFailed}, ""},
		{"reads the data directory", `ls "$1" && echo '{}'`, "", rw, e.dataDir,
			[]api.Status{api.StatusError}, []string{api.EToolFailed}, ""},
		{"writes outside its grant by ..", `echo x > /files/data/../escape.txt && echo '{}'`, "", rw, "",
			[]api.Status{api.StatusError}, []string{api.EToolFailed}, ""},
		{"writes outside its grant by symlink", `echo x > /files/data/link/secret.txt && echo '{}'`, "", rw, "",
			[]api.Status{api.StatusError}, []string{api.EToolFailed}, ""},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.t = t
			id := fmt.Sprintf("attack.t%d", i)
			registerTools(t, n, cliTool(id, c.script, c.limits, c.perms))
			tenant := fmt.Sprintf("atk%d", i)
			start := time.Now()
			resp := e.invoke(request(tenant, id, mustJSON(t, map[string]string{"arg": c.arg})))
			t.Logf("%s: %s after %v: %s", c.name, resp.Status, time.Since(start).Round(time.Millisecond), mustJSON(t, resp.Error))
			if !slices.Contains(c.statuses, resp.Status) || resp.Error == nil || !slices.Contains(c.ecodes, resp.Error.ECode) {
				t.Fatalf("got %s %s, want %v with one of %v", resp.Status, mustJSON(t, resp.Error), c.statuses, c.ecodes)
			}
			terminal := api.TypeFailed
			if resp.Status == api.StatusTimeout {
				terminal = api.TypeTimeout
			}
			msgs := e.read(subjects.StreamAudit, subjects.AuditEvent(tenant, envelope.SubjectSuffix(terminal)), 1, 10*time.Second)
			if len(msgs) != 1 || !strings.Contains(string(msgs[0].Data()), resp.Error.ECode) {
				t.Fatalf("terminal audit event: %d events", len(msgs))
			}
			if c.marker != "" {
				eventually(t, 5*time.Second, "no process left behind", func() bool { return len(processesWith(c.marker)) == 0 })
			}
		})
	}
	e.t = t
	if _, err := os.Stat(filepath.Join(root, "escape.txt")); err == nil {
		t.Fatal("a write by .. reached the host outside the grant")
	}
	if b, _ := os.ReadFile(secret); string(b) != "secret" {
		t.Fatalf("a write through a symlink changed a file outside the grant: %q", b)
	}
	if resp := e.invoke(request("after", "echo", `{"message":"still here"}`)); resp.Status != api.StatusSuccess {
		t.Fatalf("after the attacks: %+v", resp)
	}
}

// TestCLIParametersAreInert: shell syntax in a parameter reaches the tool
// as one literal argument, on argv and on stdin, and a granted write lands.
func TestCLIParametersAreInert(t *testing.T) {
	e, n, root := sandboxEnv(t, topology.TopologyOptions{})
	registerTools(t, n, `{"id":"test.cli_args","name":"args","version":"1.0.0","description":"reports its argument","kind":"cli",
	  "cli":{"command":["sh","-c","read -r line; printf '%s' \"$1\" > /files/data/arg.txt; printf '{\"argc\":%d,\"stdin\":%s}' $# \"$line\"","sh","{{arg}}"]},
	  "input_schema":{"type":"object","properties":{"arg":{"type":"string"}}},
	  "output_schema":{"type":"object","required":["argc","stdin"]},
	  "permissions":{"filesystem":[{"path":"/data","mode":"rw"}]}}`)
	hostile := "; rm -rf / $(id) `id` && touch /files/data/pwned"
	resp := e.invoke(request("inert", "test.cli_args", mustJSON(t, map[string]string{"arg": hostile})))
	if resp.Status != api.StatusSuccess {
		t.Fatalf("%+v %s", resp, mustJSON(t, resp.Error))
	}
	var out struct {
		Argc  int               `json:"argc"`
		Stdin map[string]string `json:"stdin"`
	}
	if err := json.Unmarshal(resp.Result, &out); err != nil || out.Argc != 1 || out.Stdin["arg"] != hostile {
		t.Fatalf("result %s, %v", resp.Result, err)
	}
	got, err := os.ReadFile(filepath.Join(root, "data", "arg.txt"))
	if err != nil || string(got) != hostile {
		t.Fatalf("the argument as the tool saw it: %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(root, "data", "pwned")); err == nil {
		t.Fatal("the parameter was run as a command")
	}
}

// TestCLIResumesFromCheckpoint: a cli tool checkpoints through control
// lines on stdout; its execute worker dies mid-run and a second worker
// restarts it with the last checkpoint, so earlier steps are not redone.
func TestCLIResumesFromCheckpoint(t *testing.T) {
	e, n, _ := sandboxEnv(t, topology.TopologyOptions{AckWait: time.Second}, allBut(subjects.Execute)...)
	registerTools(t, n, `{"id":"test.cli_steps","name":"steps","version":"1.0.0","description":"checkpoints each step","kind":"cli",
	  "cli":{"command":["sh","-c",`+fmt.Sprintf("%q", `i=0
if [ -n "$TOOLGATE_RESUME" ]; then i=$(tr -dc 0-9 < "$TOOLGATE_RESUME"); fi
start=$i; ran=""
while [ "$i" -lt 8 ]; do
  sleep 0.3
  ran="$ran${ran:+,}$i"; i=$((i+1))
  echo "toolgate:progress $((i*100/8)) step $i"
  echo "toolgate:checkpoint {\"next\":$i}"
done
printf '{"started_at":%s,"ran":[%s]}\n' "$start" "$ran"`)+`],"stdin":"none"},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object","required":["started_at","ran"]},"limits":{"timeout_ms":60000}}`)
	doomed := e.runStage(subjects.Execute, nil, 1, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const tenant = "cliresume"
	id, err := e.client.Invoke(ctx, request(tenant, "test.cli_steps", `{}`), clientOpts(""))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "three checkpoints", func() bool {
		rec, err := e.client.Status(ctx, tenant, id)
		return err == nil && rec.Checkpoint != nil && rec.Checkpoint.Seq >= 3
	})
	rec, err := e.client.Status(ctx, tenant, id)
	if err != nil || rec.Progress == nil || rec.Progress.Percent <= 0 {
		t.Fatalf("no progress reported mid-run: %+v, %v", rec, err)
	}
	doomed.Close()
	e.runStage(subjects.Execute, nil, 1, 0)
	resp, err := e.client.Wait(ctx, tenant, id)
	if err != nil || resp.Status != api.StatusSuccess {
		t.Fatalf("resumed call: %+v, %v", resp, err)
	}
	var out struct {
		StartedAt int   `json:"started_at"`
		Ran       []int `json:"ran"`
	}
	if err := json.Unmarshal(resp.Result, &out); err != nil || out.StartedAt < 3 || len(out.Ran) == 0 || out.Ran[0] != out.StartedAt ||
		out.Ran[len(out.Ran)-1] != 7 || resp.ExecutionMetadata.ResumedFromCheckpoint < 3 {
		t.Fatalf("did not resume from the checkpoint: %s, metadata %+v", resp.Result, resp.ExecutionMetadata)
	}
	// Execute's checkpoint events reach AUDIT through audit's relay, which
	// may still be carrying the last when the result is in.
	eventually(t, 10*time.Second, "8 checkpoint.created events", func() bool {
		return e.count(subjects.StreamAudit, subjects.AuditEvent(tenant, envelope.SubjectSuffix(api.TypeCheckpointCreated))) >= 8
	})
}

// TestExampleCLITool: the shipped text.word_count runs in the sandbox and
// counts a text full of shell syntax as text.
func TestExampleCLITool(t *testing.T) {
	e, _, _ := sandboxEnv(t, topology.TopologyOptions{})
	resp := e.invoke(request("wc", "text.word_count", `{"text":"one $(id) two\n; rm -rf / three\n"}`))
	var counts struct{ Lines, Words, Bytes int }
	_ = json.Unmarshal(resp.Result, &counts)
	if resp.Status != api.StatusSuccess || counts.Lines != 2 || counts.Words != 8 || counts.Bytes != 31 {
		t.Fatalf("%s %s %s", resp.Status, resp.Result, mustJSON(t, resp.Error))
	}
	// What its processes used is in the result; a run without network
	// reports no network bytes.
	md := resp.ExecutionMetadata
	if md == nil || md.MemoryPeakMB < 1 || md.NetworkBytesIn != nil || md.NetworkBytesOut != nil {
		t.Fatalf("execution metadata %s", mustJSON(t, md))
	}
}

// TestCLIRefusedWithoutSandbox: where bubblewrap cannot run, a cli tool is
// refused with E3101 and the reason, an audit event, and nothing run; other
// kinds keep working.
func TestCLIRefusedWithoutSandbox(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{Stages: allBut(subjects.Execute)})
	n, err := node.Open(context.Background(), e.url, "test-nosandbox", e.topo, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	st, err := n.NewStage(context.Background(), subjects.Execute, node.StageConfig{Builtins: e.builtins(t.TempDir())})
	if err != nil {
		t.Fatal(err)
	}
	x := st.(*execute.Executor)
	x.Kind("cli").(*clitool.Kind).SandboxErr = errors.New("bubblewrap (bwrap) is not installed")
	e.runStage(subjects.Execute, x, 1, 0)
	resp := e.invoke(request("nosb", "text.word_count", `{"text":"a b"}`))
	if resp.Status != api.StatusError || resp.Error == nil || resp.Error.ECode != api.EExecutorUnavailable ||
		!strings.Contains(resp.Error.Message, "bwrap") || !strings.Contains(resp.Error.Message, "--sandbox none") {
		t.Fatalf("cli tool without a sandbox: %s %s", resp.Status, mustJSON(t, resp.Error))
	}
	if n := e.count(subjects.StreamAudit, subjects.AuditEvent("nosb", envelope.SubjectSuffix(api.TypeFailed))); n != 1 {
		t.Fatalf("%d failed audit events, want 1", n)
	}
	if resp := e.invoke(request("nosb", "echo", `{"message":"x"}`)); resp.Status != api.StatusSuccess {
		t.Fatalf("a builtin beside the refused cli tool: %+v", resp)
	}
}
