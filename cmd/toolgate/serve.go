package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/toolgate/toolgate/internal/bench"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// pipelineFlags are shared by serve and stage.
func pipelineFlags(fs *pflag.FlagSet, c *node.Config) *string {
	fs.BoolVar(&c.AuthCallout, "auth-callout", false, "with --nats, also run the bus's auth callout with the keys in <data>/busauth")
	fs.StringVar(&c.ControlCreds, "control-creds", "", "with --nats, the credentials the control service connects with beside the stages (default <data>/busauth/control.creds)")
	fs.IntVar(&c.Workers, "workers", node.DefaultWorkers, "calls execute runs at once (plus an eighth for tenants below their share); each mostly waits, so memory bounds it, not cores")
	fs.IntVar(&c.InFlight, "inflight", node.DefaultInFlight, "messages each stage but execute holds at once (processed, or waiting for its publishes to be acknowledged)")
	fs.IntVar(&c.TenantInFlight, "tenant-inflight", 0, "cap on one tenant's share of --workers while other tenants run calls (0: an equal share, -1: no quota); a tenant alone may use them all")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "serve Prometheus metrics on this address (/metrics)")
	fs.StringVar(&c.OTLPEndpoint, "otlp-endpoint", "", "export traces over OTLP/HTTP to this URL (https for TLS) or host:port (default $OTEL_EXPORTER_OTLP_ENDPOINT); the OTEL_EXPORTER_OTLP_* variables apply")
	fs.StringVar(&c.PolicyPath, "policy", "", "Rego policy file or directory (default: the shipped policy)")
	fs.StringVar(&c.Stage.BuiltinEnv.FileRoot, "file-root", "", "directory the read_file builtin is confined to and cli tools' granted paths are under (empty: disabled)")
	fs.StringVar(&c.Stage.SecretsDir, "secrets-dir", "", "directory with one file per secret http tools may inject (also read: TOOLGATE_SECRET_<NAME> variables)")
	fs.BoolVar(&c.Stage.HTTPAllowPrivateNetworks, "http-allow-private-networks", false, "let http tools reach loopback, private and link-local addresses through granted host names (IP literals granted as such always work)")
	fs.StringVar(&c.Stage.Sandbox.Mode, "sandbox", "bwrap", "how cli tools run: bwrap (isolated) or none (limits only, no isolation; see docs/sandbox.md)")
	fs.StringSliceVar(&c.Stage.Sandbox.ReadOnlyRoots, "mcp-path-roots", nil, "host directories MCP servers' read_only_paths must lie under, symlinks resolved (default: "+node.DefaultMCPInstallDir+" and the file root)")
	fs.IntVar(&c.Stage.MaxEventBytes, "max-event-bytes", 1<<20, "largest accepted tool.invoke event")
	fs.StringVar(&c.DetectorRulesPath, "detector-rules", "", "detector rule set replacing the shipped one (JSON)")
	fs.StringVar(&c.SafetyConfigPath, "safety-config", "", `per-tenant output actions, {"tenants":{"acme":{"pii":"reject"}}}`)
	fs.StringVar(&c.DefaultsPath, "defaults", "", `defaults where a manifest is silent, for the deployment and per tenant, {"concurrent_tools_per_agent":8,"tenants":{"acme":{"rate_limit":{"requests":600,"per_seconds":60}}}} (docs/tools.md)`)
	fs.IntVar(&c.Topology.Replicas, "replicas", 1, "replicas of streams and buckets created at start")
	fs.DurationVar(&c.Topology.AuditMaxAge, "audit-max-age", 0, "age limit of the AUDIT stream when created (default 90 days; negative: forever)")
	fs.DurationVar(&c.Stage.AuditArchiveEvery, "archive-every", time.Hour, "how often audit archives the closed ranges of AUDIT (0: never); well under --audit-max-age, so nothing ages out unarchived")
	fs.StringVar(&c.Stage.AuditArchive, "archive", "", "where: nats://[BUCKET] (default: the bus's toolgate_audit_archive bucket) or s3://BUCKET/PREFIX (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... or ?endpoint=); docs/audit.md")
	fs.StringVar(&c.Stage.AuditOTLP, "audit-otlp", "", "send the audit events to a SIEM as OpenTelemetry log records, over OTLP/HTTP to this URL (/v1/logs added when it has no path) or host:port; docs/audit.md")
	fs.Int64Var(&c.Topology.InvokeMaxBytes, "invoke-max-bytes", 0, "byte limit of the invoke stream when created (default 1 GiB); a full stream refuses publishers")
	fs.DurationVar(&c.Stage.MicroCheckpointInterval, "checkpoint-every", node.DefaultMicroCheckpointInterval, "how often a running tool's reported state is stored as a micro checkpoint, unless its manifest or the call says otherwise (0: every state)")
	fs.DurationVar(&c.Topology.CheckpointRetention, "checkpoint-retention", 0, "how long macro checkpoints can be resumed (default 90 days); micro ones can for an hour, named ones until deleted")
	fs.DurationVar(&c.Topology.AckWait, "ack-wait", 30*time.Second, "stage consumers' ack wait")
	fs.IntVar(&c.Topology.MaxDeliver, "max-deliver", 5, "deliveries before an invocation ends with E3901")
	fs.StringVar(&c.JWKSPath, "jwks", "", "key set (JWKS file) capability tokens are verified with; reloaded on change")
	fs.StringVar(&c.GrantKeyPath, "grant-key", "", "private JWK that signs the child tokens of granted capability requests (its public key must be in --jwks); default with --examples: the development key")
	fs.StringVar(&c.TokenIssuer, "token-issuer", "toolgate", "required iss of capability tokens")
	fs.StringVar(&c.TokenAudience, "token-audience", "toolgate", "required aud of capability tokens")
	fs.DurationVar(&c.TokenMaxLifetime, "token-max-lifetime", token.DefaultMaxLifetime, "longest capability token lifetime (exp - iat) accepted")
	fs.IntVar(&c.SiteRate, "site-rate", node.DefaultSiteRate, "messages a second the hub forwards from each site's outbox to verify and audit; more wait in the site's outbox (docs/sites.md)")
	fs.DurationVar(&c.Stage.SiteWait, "site-wait", node.DefaultSiteWait, "how long a call for a site's tool may wait at the hub for its site before it ends with E3271 (docs/sites.md)")
	fs.DurationVar(&c.Stage.ApprovalTimeout, "approval-timeout", 15*time.Minute, "how long a call waits for a human's approval before it ends denied")
	fs.BoolVar(&c.Stage.RecordDecisions, "record-decisions", false, "authorize audits each call's policy input (parameters redacted) and decision, for toolgate policy replay")
	fs.BoolVar(&c.ResetSecuritySettings, "reset-security-settings", false, "replace the cluster's recorded security settings (key set, token issuer/audience, sandbox, file root, http private networks) with this process's instead of refusing to start when they differ")
	return fs.String("log-level", "info", "debug, info, warn or error")
}

func logger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

func (a *app) serveCmd() *cobra.Command {
	var c node.Config
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run all six stages and the control service, with an embedded NATS server unless --nats is given",
		Example: `  toolgate serve --examples --file-root ./examples/files
  toolgate serve --nats nats://nats:4222 --jwks jwks.json`,
		Args: noArgs,
	}
	level := pipelineFlags(cmd.Flags(), &c)
	prof := profileFlags(cmd.Flags())
	collector := gcFlag(cmd.Flags())
	cmd.Flags().StringVar(&c.Embedded.Listen, "listen", "127.0.0.1:4222", "embedded NATS listen address")
	cmd.Flags().StringVar(&c.Embedded.LeafListen, "leaf-listen", "", "also accept sites' leaf-node connections on this address, e.g. 0.0.0.0:7422 (docs/sites.md; off by default)")
	cmd.Flags().StringVar(&c.Site, "site", "", "run as this site: execute alone, behind a leaf node of the hub at --hub, with the site's bundle as --data (toolgate site add; docs/sites.md)")
	cmd.Flags().StringVar(&c.Hub, "hub", "", "with --site, the hub's leaf-node URL, nats-leaf://HOST:7422")
	cmd.Flags().BoolVar(&c.Examples, "examples", false, "register the example tools at start (and, without --jwks, write a development token)")
	cmd.Flags().StringVar(&c.OperatorCreds, "operator-creds", "", "with --nats, operator credentials to set up the topology with at start (default <data>/busauth/operator.creds when there; without them the stages wait for `toolgate setup`)")
	var con consoleOptions
	cmd.Flags().StringVar(&con.listen, "console", "", "also serve the web console on this address, as approver:local (see toolgate console; a non-loopback one needs --console-tls-cert and --console-tls-key)")
	cmd.Flags().BoolVar(&con.allowAdmin, "console-allow-admin", false, "let the console run with admin or operator credentials named by the connection flags")
	con.tlsFlags(cmd.Flags(), "console-")
	syncMode := cmd.Flags().String("sync", "always", "when the embedded server fsyncs its store: always (before acknowledging each write; survives a power cut), interval (every 2 minutes, nats-server's default) or an interval such as 10s; acknowledged writes not yet fsynced are lost if the machine loses power")
	memoryHops := cmd.Flags().Bool("memory-hops", true, "with the embedded server, keep the hand-offs between stages in memory and each invocation on disk until it ends, re-driven from there at the next start (docs/delivery.md); applies when the streams are created")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		var err error
		// Only the embedded server restarts with the stages that re-drive
		// what its memory lost.
		c.Topology.MemoryHops = *memoryHops && !cmd.Flags().Changed("nats")
		if c.Embedded.SyncAlways, c.Embedded.SyncInterval, err = parseSync(*syncMode); err != nil {
			return err
		}
		// Only an explicit --nats leaves the embedded server out: NATS_URL
		// is where clients look, not what serve runs on.
		if cmd.Flags().Changed("nats") {
			c.NATSURL = a.conn.URL
			c.Creds = a.conn.Creds
		}
		c.Embedded.DataDir = a.data
		if c.Site != "" {
			// The site's bundle holds its credentials.
			c.Creds = cmp.Or(a.conn.Creds, filepath.Join(a.data, busauth.DirName, busauth.SiteCredsFile))
		}
		c.OTLPEndpoint = orEnv(c.OTLPEndpoint, "OTEL_EXPORTER_OTLP_ENDPOINT")
		c.Log = logger(a.stderr, *level)
		collector.apply()
		stop, err := prof.start(c.Log)
		if err != nil {
			return err
		}
		defer stop()
		if c.Examples {
			c.Ready = func(url string, n *node.Node) {
				a.printWelcome(url, c.Stage.BuiltinEnv.FileRoot, n, a.data)
			}
		}
		if con.listen != "" {
			if err := con.check("--console", "console-"); err != nil {
				return err
			}
			ready := c.Ready
			c.Ready = func(url string, n *node.Node) {
				if ready != nil {
					ready(url, n)
				}
				go func() {
					if err := a.serveConsole(cmd.Context(), url, con); err != nil {
						c.Log.Error("console", "err", err)
					}
				}()
			}
		}
		return node.Run(cmd.Context(), c)
	}
	return cmd
}

// parseSync reads --sync: "always", "interval" (the server's default
// interval) or a positive duration.
func parseSync(s string) (always bool, interval time.Duration, err error) {
	switch s {
	case "always":
		return true, 0, nil
	case "interval":
		return false, 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return false, 0, usageErr("--sync %q: want always, interval or a positive duration such as 10s", s)
	}
	return false, d, nil
}

func orEnv(v, env string) string {
	if v != "" {
		return v
	}
	return os.Getenv(env)
}

func (a *app) stageCmd() *cobra.Command {
	var c node.Config
	names := append(append([]string{}, subjects.Stages...), "control", node.AuthCallout)
	cmd := &cobra.Command{
		Use:       "stage NAME",
		Short:     "Run one stage (" + strings.Join(names, ", ") + ") against a NATS server",
		Example:   "  toolgate stage execute --nats nats://nats:4222 --workers 16 --metrics-addr :9464",
		Args:      exactArgs(1, "a stage name ("+strings.Join(names, ", ")+")"),
		ValidArgs: names,
	}
	level := pipelineFlags(cmd.Flags(), &c)
	prof := profileFlags(cmd.Flags())
	collector := gcFlag(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c.NATSURL = a.conn.ServerURL()
		c.Creds = a.conn.Creds
		c.Embedded.DataDir = a.data
		c.Stages = []string{args[0]}
		c.AuthCallout = args[0] == node.AuthCallout
		c.OTLPEndpoint = orEnv(c.OTLPEndpoint, "OTEL_EXPORTER_OTLP_ENDPOINT")
		c.Log = logger(a.stderr, *level)
		collector.apply()
		stop, err := prof.start(c.Log)
		if err != nil {
			return err
		}
		defer stop()
		return node.Run(cmd.Context(), c)
	}
	return cmd
}

func (a *app) setupCmd() *cobra.Command {
	var topo topology.TopologyOptions
	cmd := &cobra.Command{
		Use:   "setup",
		Short: "Create the NATS topology (streams, stage consumers, buckets) with operator credentials",
		Long: `Create what is missing of toolgate's NATS topology: its streams, the stages'
durable consumers and the buckets, with the watched buckets' changes
republished for the stages. Existing streams and consumers are left as they
are. Stage and control processes never create any of it (their roles may
not): they wait until it exists. serve does this itself when it holds
operator credentials; run setup once before starting stages elsewhere.`,
		Example: "  toolgate setup --nats nats://nats:4222 --creds operator.creds --replicas 3",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := a.conn.NATSOptions()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			n, err := node.Open(ctx, a.conn.ServerURL(), "toolgate-setup", topo, logger(a.stderr, "warn"),
				append(opts, nats.RetryOnFailedConnect(false), nats.MaxReconnects(0))...)
			if err != nil {
				return &codeError{code: exitConnect, err: fmt.Errorf("setup: %w", err)}
			}
			n.Close()
			if a.json {
				return a.printJSON(map[string]any{"topology": "ready"})
			}
			fmt.Fprintln(a.stdout, "toolgate topology ready: streams, stage consumers and buckets exist")
			return nil
		},
	}
	cmd.Flags().IntVar(&topo.Replicas, "replicas", 1, "replicas of streams and buckets created")
	cmd.Flags().DurationVar(&topo.AuditMaxAge, "audit-max-age", 0, "age limit of the AUDIT stream when created (default 90 days; negative: forever)")
	cmd.Flags().Int64Var(&topo.InvokeMaxBytes, "invoke-max-bytes", 0, "byte limit of the invoke stream when created (default 1 GiB)")
	cmd.Flags().DurationVar(&topo.AckWait, "ack-wait", 30*time.Second, "stage consumers' ack wait")
	cmd.Flags().IntVar(&topo.MaxDeliver, "max-deliver", 5, "deliveries before an invocation ends with E3901")
	return cmd
}

func (a *app) benchCmd() *cobra.Command {
	var o bench.Options
	var noisyOnly bool
	var serveBinary string
	var prof *profiling
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Offer load to toolgate as shipped (a serve process) and in-process, and report latency and throughput",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			stop, err := prof.start(discard())
			if err != nil {
				return err
			}
			defer stop()
			if noisyOnly {
				n, err := bench.RunNoisy(cmd.Context(), o)
				if err != nil {
					return err
				}
				n.Print(a.stdout)
				return nil
			}
			// The scaling series starts `toolgate stage` processes of
			// this very binary.
			if exe, err := os.Executable(); err == nil {
				o.Binary = exe
			}
			if serveBinary != "" {
				o.ServeBinary = serveBinary
			}
			rep, err := bench.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(rep)
			}
			rep.Print(a.stdout)
			return nil
		},
	}
	cmd.Flags().IntVar(&o.Rate, "rate", 300, "offered load, invocations per second")
	cmd.Flags().DurationVar(&o.Duration, "duration", 10*time.Second, "how long to offer load")
	cmd.Flags().IntVar(&o.Workers, "workers", 4, "workers per stage")
	cmd.Flags().StringVar(&o.Dir, "dir", "", "storage directory (default: a temporary one)")
	cmd.Flags().BoolVar(&noisyOnly, "noisy", false, "measure only the noisy-neighbour series")
	cmd.Flags().BoolVar(&o.GoalsOnly, "goals", false, "measure only the goals: saturation and latency beside the bare chain, authorization and the detectors")
	cmd.Flags().IntVar(&o.SaturationN, "saturation-n", 2000, "invocations offered by each saturation series")
	cmd.Flags().BoolVar(&o.ShippedOnly, "shipped", false, "measure only toolgate as shipped: a `toolgate serve` process with its defaults, beside the chains on its server")
	cmd.Flags().StringVar(&serveBinary, "serve-binary", "", "measure the serve process of this toolgate binary (another build, for a before and after) instead of this one's")
	cmd.Flags().StringVar(&o.BaselineBinary, "baseline-binary", "", "also measure the serve of this toolgate binary in the same saturation rounds with --sync interval, in turn (make bench: the starting build, whose own CPU per call goal 4 halves)")
	cmd.Flags().StringVar(&o.ServeSync, "serve-sync", "", "measure those serves with this --sync alone (default: always, as shipped, then interval, where CPU rather than the disk bounds the run)")
	cmd.Flags().StringVar(&o.ServeProfile, "serve-cpuprofile", "", "write a CPU profile of that serve process under saturation load to this file")
	cmd.Flags().DurationVar(&o.Soak, "soak", 0, "also run at half of saturation this long and report whether memory grows (make bench: 10m)")
	prof = profileFlags(cmd.Flags())
	return cmd
}

func (a *app) printWelcome(url, root string, n *node.Node, dataDir string) {
	w := a.stdout
	fmt.Fprintf(w, `
toolgate is running: NATS at %s, all six stages, example tools registered.
Every connection is authenticated (docs/security.md). The operator's
credentials are in %s; toolgate and the nats CLI both read:

  export NATS_NKEY=%s NATS_TOKEN="$(cat %s)"
`, url, filepath.Dir(node.CredsPath(dataDir, busauth.RoleOperator)),
		filepath.Join(dataDir, busauth.DirName, "operator.nk"), filepath.Join(dataDir, busauth.DirName, "operator.jwt"))
	if n.DevToken != "" {
		fmt.Fprintf(w, `
A development token for tenant %s (agent %s) is in %s;
toolgate's client commands use it by itself. Its grants: every tool, files
read-only, nothing pre-approved, 24 h (toolgate token inspect shows them):
so a high-risk call such as fs.write_file needs a token granting writes
(token mint --mode rw) and then waits for a human: toolgate approve ID.
For other clients:

  export TOOLGATE_TOKEN=$(cat %s)

An agent connects with it as its NATS token and inbox prefix %s:

  nats --token "$TOOLGATE_TOKEN" --inbox-prefix %s ...
`, node.DevTenant, node.DevAgent, node.DevTokenPath(dataDir), node.DevTokenPath(dataDir), n.DevInboxPrefix, n.DevInboxPrefix)
	}
	fmt.Fprintf(w, `
In another terminal (toolgate and nats not on PATH? make install, then
export PATH="$PWD/bin:$PATH"):

  toolgate tools list
  toolgate invoke echo --params '{"message":"hello"}' --wait
  toolgate tail --all

or with the nats CLI:

  nats pub tool.invoke.demo "{\"tool_id\":\"echo\",\"capability_token\":\"$TOOLGATE_TOKEN\",\"agent_context\":{\"agent_did\":\"did:agent:demo\",\"tenant_id\":\"demo\"},\"parameters\":{\"message\":\"hi\"}}" \
    -H ce-specversion:1.0 -H 'ce-id:{{ID}}' -H ce-source:urn:demo -H ce-type:tool.invoke -H content-type:application/json
  nats sub 'tool.result.demo.>' --all
  nats sub 'audit.demo.>' --all
`)
	if root != "" {
		fmt.Fprintf(w, "\nread_file is confined to %s:\n  toolgate invoke fs.read_file --params '{\"path\":\"README.md\"}' --wait\n", root)
	}
	fmt.Fprintln(w, "\nCtrl-C drains in-flight work and stops.")
}
