// Command toolgate is the tool-execution layer for AI agents: one binary that
// serves the pipeline, runs single stages, and talks to a running toolgate.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/bench"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/subjects"
)

const usage = `toolgate: the tool-execution layer for AI agents

usage:
  toolgate serve  [--examples] [--data DIR] [--listen HOST:PORT | --nats URL] [flags]
  toolgate stage  NAME --nats URL [--workers N] [flags]     NAME: %s, control
  toolgate invoke TOOL --tenant T [--params JSON] [--version V] [--wait]
  toolgate status ID --tenant T
  toolgate cancel ID --tenant T [--reason R]
  toolgate tail   [--tenant T] [--all] [--count N]
  toolgate audit  export [--since T] [--until T] [--tenant T] > audit.jsonl
  toolgate tools  register FILE [--replace] | list | get ID [--version V]
  toolgate token  keygen | mint --key K [--parent TOKEN] [grants] | inspect TOKEN | revoke TOKEN
  toolgate policy push DIR | show
  toolgate breakers [list] | open KEY | close KEY | release KEY
  toolgate approve ID [--tenant T] [--reason R]
  toolgate deny    ID [--tenant T] [--reason R]
  toolgate bench  [--rate N] [--duration D]

Run 'toolgate COMMAND -h' for a command's flags.
`

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "toolgate:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		fmt.Fprintf(os.Stderr, usage, strings.Join(subjects.Stages, ", "))
		return flag.ErrHelp
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return serve(ctx, rest)
	case "stage":
		return stage(ctx, rest)
	case "invoke":
		return invoke(ctx, rest)
	case "status":
		return status(ctx, rest)
	case "tail":
		return tail(ctx, rest)
	case "audit":
		return auditCmd(ctx, rest)
	case "tools":
		return toolsCmd(ctx, rest)
	case "bench":
		return benchCmd(ctx, rest)
	case "token":
		return tokenCmd(ctx, rest)
	case "policy":
		return policyCmd(ctx, rest)
	case "breakers":
		return breakersCmd(ctx, rest)
	case "cancel":
		return cancelCmd(ctx, rest)
	case "approve":
		return decideCmd(ctx, rest, true)
	case "deny":
		return decideCmd(ctx, rest, false)
	case "help", "-h", "--help":
		fmt.Fprintf(os.Stdout, usage, strings.Join(subjects.Stages, ", "))
		return nil
	}
	return fmt.Errorf("unknown command %q (try 'toolgate help')", cmd)
}

// natsURL is the default server of client commands: $NATS_URL, as the nats
// CLI reads it, else the local default.
func natsURL() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return nats.DefaultURL
}

// pipelineFlags are shared by serve and stage.
func pipelineFlags(fs *flag.FlagSet, c *node.Config) *string {
	fs.IntVar(&c.Workers, "workers", 4, "workers per stage")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "serve Prometheus metrics on this address (/metrics)")
	fs.StringVar(&c.OTLPEndpoint, "otlp-endpoint", os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"), "export traces over OTLP/HTTP to this URL (https for TLS) or host:port; the OTEL_EXPORTER_OTLP_* variables apply")
	fs.StringVar(&c.PolicyPath, "policy", "", "Rego policy file or directory (default: the shipped policy)")
	fs.StringVar(&c.Stage.BuiltinEnv.FileRoot, "file-root", "", "directory the read_file builtin is confined to and cli tools' granted paths are under (empty: disabled)")
	fs.StringVar(&c.Stage.SecretsDir, "secrets-dir", "", "directory with one file per secret http tools may inject (also read: TOOLGATE_SECRET_<NAME> variables)")
	fs.BoolVar(&c.Stage.HTTPAllowPrivateNetworks, "http-allow-private-networks", false, "let http tools reach loopback, private and link-local addresses through granted host names (IP literals granted as such always work)")
	fs.StringVar(&c.Stage.Sandbox.Mode, "sandbox", "bwrap", "how cli tools run: bwrap (isolated) or none (limits only, no isolation; see docs/sandbox.md)")
	fs.IntVar(&c.Stage.MaxEventBytes, "max-event-bytes", 1<<20, "largest accepted tool.invoke event")
	fs.StringVar(&c.DetectorRulesPath, "detector-rules", "", "detector rule set replacing the shipped one (JSON)")
	fs.StringVar(&c.SafetyConfigPath, "safety-config", "", `per-tenant output actions, {"tenants":{"acme":{"pii":"reject"}}}`)
	fs.IntVar(&c.Topology.Replicas, "replicas", 1, "replicas of streams and buckets created at start")
	fs.DurationVar(&c.Topology.AckWait, "ack-wait", 30*time.Second, "stage consumers' ack wait")
	fs.IntVar(&c.Topology.MaxDeliver, "max-deliver", 5, "deliveries before an invocation ends with E3901")
	fs.DurationVar(&c.Topology.AuditMaxAge, "audit-max-age", 0, "age limit of the AUDIT stream when created (default 90 days; negative: forever)")
	fs.Int64Var(&c.Topology.InvokeMaxBytes, "invoke-max-bytes", 0, "byte limit of the invoke stream when created (default 1 GiB); a full stream refuses publishers")
	fs.StringVar(&c.JWKSPath, "jwks", "", "key set (JWKS file) capability tokens are verified with; reloaded on change")
	fs.StringVar(&c.TokenIssuer, "token-issuer", "toolgate", "required iss of capability tokens")
	fs.StringVar(&c.TokenAudience, "token-audience", "toolgate", "required aud of capability tokens")
	fs.DurationVar(&c.Stage.ApprovalTimeout, "approval-timeout", 15*time.Minute, "how long a call waits for a human's approval before it ends denied")
	fs.BoolVar(&c.ResetSecuritySettings, "reset-security-settings", false, "replace the cluster's recorded security settings (key set, token issuer/audience, sandbox, file root, http private networks) with this process's instead of refusing to start when they differ")
	return fs.String("log-level", "info", "debug, info, warn or error")
}

func logger(level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}

func serve(ctx context.Context, args []string) error {
	var c node.Config
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	level := pipelineFlags(fs, &c)
	fs.StringVar(&c.NATSURL, "nats", "", "use this NATS server instead of an embedded one")
	fs.StringVar(&c.Embedded.Listen, "listen", "127.0.0.1:4222", "embedded NATS listen address")
	fs.StringVar(&c.Embedded.DataDir, "data", "toolgate-data", "embedded NATS JetStream storage directory")
	fs.BoolVar(&c.Examples, "examples", false, "register the example tools at start")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c.Log = logger(*level)
	if c.Examples {
		c.Ready = func(url string, n *node.Node) {
			printWelcome(url, c.Stage.BuiltinEnv.FileRoot, n.DevToken, c.Embedded.DataDir)
		}
	}
	return node.Run(ctx, c)
}

func stage(ctx context.Context, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return fmt.Errorf("stage: name one of %s, control", strings.Join(subjects.Stages, ", "))
	}
	var c node.Config
	fs := flag.NewFlagSet("stage", flag.ContinueOnError)
	level := pipelineFlags(fs, &c)
	fs.StringVar(&c.NATSURL, "nats", natsURL(), "NATS server URL (default: $NATS_URL, else "+nats.DefaultURL+")")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	c.Stages = []string{args[0]}
	c.Log = logger(*level)
	return node.Run(ctx, c)
}

func printWelcome(url, root, devToken, dataDir string) {
	fmt.Printf(`
toolgate is running: NATS at %s, all six stages, example tools registered.
`, url)
	if devToken != "" {
		fmt.Printf(`
A development token for tenant %s (agent %s, every tool, 24 h) is in
%s; toolgate invoke uses it by itself. For other clients:

  export TOOLGATE_TOKEN=$(cat %s)
`, node.DevTenant, node.DevAgent, node.DevTokenPath(dataDir), node.DevTokenPath(dataDir))
	}
	fmt.Printf(`
In another terminal:

  go run ./cmd/toolgate tools list
  go run ./cmd/toolgate invoke echo --tenant demo --params '{"message":"hello"}' --wait
  go run ./cmd/toolgate tail --tenant demo --all

or with the nats CLI:

  nats pub tool.invoke.demo "{\"tool_id\":\"echo\",\"capability_token\":\"$TOOLGATE_TOKEN\",\"agent_context\":{\"agent_did\":\"did:agent:demo\",\"tenant_id\":\"demo\"},\"parameters\":{\"message\":\"hi\"}}" \
    -H ce-specversion:1.0 -H 'ce-id:{{ID}}' -H ce-source:urn:demo -H ce-type:tool.invoke -H content-type:application/json
  nats sub 'tool.result.demo.>' --all
  nats sub 'audit.demo.>' --all
`)
	if root != "" {
		fmt.Printf("\nread_file is confined to %s:\n  go run ./cmd/toolgate invoke fs.read_file --tenant demo --params '{\"path\":\"README.md\"}' --wait\n", root)
	}
	fmt.Println("\nCtrl-C drains in-flight work and stops.")
}

func connect(url string) (*client.Client, func(), error) {
	nc, err := nats.Connect(url, nats.Name("toolgate-cli"))
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to %s: %w", url, err)
	}
	c, err := client.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return c, nc.Close, nil
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func invoke(ctx context.Context, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return errors.New("invoke: name a tool, e.g. toolgate invoke echo --tenant demo --params '{\"message\":\"hi\"}'")
	}
	fs := flag.NewFlagSet("invoke", flag.ContinueOnError)
	url := fs.String("nats", natsURL(), "NATS server URL (default: $NATS_URL, else "+nats.DefaultURL+")")
	tenant := fs.String("tenant", "demo", "tenant id")
	params := fs.String("params", "{}", "parameters as a JSON object")
	version := fs.String("version", "", "exact version or semver range (default: latest)")
	agent := fs.String("agent", node.DevAgent, "agent DID")
	session := fs.String("session", "", "session id")
	id := fs.String("id", "", "invocation id (default: a new UUID)")
	tok := fs.String("token", os.Getenv("TOOLGATE_TOKEN"), "capability token (default: $TOOLGATE_TOKEN, else the development token in --data)")
	data := fs.String("data", "toolgate-data", "data directory of a local serve --examples")
	wait := fs.Bool("wait", false, "wait for the result and print it")
	async := fs.Bool("async", false, "ask for async_mode: toolgate answers at once with pending and where to poll")
	timeout := fs.Duration("timeout", 60*time.Second, "how long --wait waits")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if !json.Valid([]byte(*params)) {
		return fmt.Errorf("--params is not valid JSON: %s", *params)
	}
	c, closeFn, err := connect(*url)
	if err != nil {
		return err
	}
	defer closeFn()
	req := api.Request{
		ToolID: args[0], ToolVersion: *version, Parameters: json.RawMessage(*params), CapabilityToken: devToken(*tok, *data),
		AgentContext: api.AgentContext{AgentDID: *agent, TenantID: *tenant, SessionID: *session},
	}
	if *async {
		req.ExecutionOptions = &api.ExecutionOptions{AsyncMode: true}
	}
	invID, err := c.Invoke(ctx, req, client.InvokeOptions{ID: *id})
	if err != nil {
		return err
	}
	if !*wait {
		return printJSON(api.Response{InvocationID: invID, Status: api.StatusPending,
			PollingInfo: &api.PollingInfo{ResultSubject: subjects.Result(*tenant, invID), StatusSubject: subjects.SvcStatus}})
	}
	wctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	resp, err := c.Wait(wctx, *tenant, invID)
	if err != nil {
		return err
	}
	return printJSON(resp)
}

func status(ctx context.Context, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return errors.New("status: give an invocation id")
	}
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	url := fs.String("nats", natsURL(), "NATS server URL (default: $NATS_URL, else "+nats.DefaultURL+")")
	tenant := fs.String("tenant", "demo", "tenant id")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	c, closeFn, err := connect(*url)
	if err != nil {
		return err
	}
	defer closeFn()
	rec, err := c.Status(ctx, *tenant, args[0])
	if err != nil {
		return err
	}
	return printJSON(rec)
}

var errTailDone = errors.New("tail: count reached")

func tail(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tail", flag.ContinueOnError)
	url := fs.String("nats", natsURL(), "NATS server URL (default: $NATS_URL, else "+nats.DefaultURL+")")
	tenant := fs.String("tenant", "", "only this tenant's events")
	all := fs.Bool("all", false, "start from the first event, not the next one")
	count := fs.Int("count", 0, "stop after this many events (0: follow until interrupted)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, closeFn, err := connect(*url)
	if err != nil {
		return err
	}
	defer closeFn()
	n := 0
	err = c.Tail(ctx, *tenant, *all, func(subject string, data []byte) error {
		if _, err := fmt.Printf("%s %s\n", subject, data); err != nil {
			return err
		}
		if n++; *count > 0 && n >= *count {
			return errTailDone
		}
		return nil
	})
	if errors.Is(err, errTailDone) {
		return nil
	}
	return err
}

func toolsCmd(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("tools: register FILE | list | get ID | import-mcp --server NAME [--url URL | -- COMMAND ARGS]")
	}
	if args[0] == "import-mcp" {
		return importMCPCmd(ctx, args[1:])
	}
	fs := flag.NewFlagSet("tools "+args[0], flag.ContinueOnError)
	url := fs.String("nats", natsURL(), "NATS server URL (default: $NATS_URL, else "+nats.DefaultURL+")")
	replace := fs.Bool("replace", false, "register: replace an existing id and version")
	version := fs.String("version", "", "get: exact version or range")
	category := fs.String("category", "", "list: only this category")
	sub, rest := args[0], args[1:]
	var operand string
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		operand, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return err
	}
	c, closeFn, err := connect(*url)
	if err != nil {
		return err
	}
	defer closeFn()
	switch sub {
	case "register":
		doc, err := os.ReadFile(operand)
		if err != nil {
			return err
		}
		out, err := c.RegisterTool(ctx, doc, *replace)
		if err != nil {
			return err
		}
		return printJSON(out)
	case "list":
		out, err := c.ListTools(ctx, api.ListRequest{Category: *category})
		if err != nil {
			return err
		}
		return printJSON(out)
	case "get":
		out, err := c.GetTool(ctx, operand, *version)
		if err != nil {
			return err
		}
		return printJSON(out)
	}
	return fmt.Errorf("tools: unknown subcommand %q", sub)
}

func benchCmd(ctx context.Context, args []string) error {
	var o bench.Options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.IntVar(&o.Rate, "rate", 300, "offered load, invocations per second")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "how long to offer load")
	fs.IntVar(&o.Workers, "workers", 4, "workers per stage")
	fs.StringVar(&o.Dir, "dir", "", "storage directory (default: a temporary one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rep, err := bench.Run(ctx, o)
	if err != nil {
		return err
	}
	rep.Print(os.Stdout)
	return nil
}
