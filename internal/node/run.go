package node

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/control"
	"github.com/toolgate/toolgate/internal/detect"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/stages/execute/modeltool"
	"github.com/toolgate/toolgate/subjects"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Control is the pseudo-stage name of the control services.
const Control = "control"

// AuthCallout is the pseudo-stage name of the bus's auth callout alone
// (Config.AuthCallout, for external servers).
const AuthCallout = "authcallout"

// Config configures Run.
type Config struct {
	// NATSURL is the server to use; empty starts an embedded one, always
	// with bus authentication (docs/security.md).
	NATSURL string
	// Creds is the credentials file (busauth.IssueCredentials) this process
	// connects to NATSURL with; default: the worker.creds serve wrote in
	// Embedded.DataDir/busauth, when it is there.
	Creds string
	// AuthCallout runs the bus's auth callout against NATSURL too, with
	// the keys in Embedded.DataDir/busauth (as the embedded server does);
	// several instances share the work in a queue group.
	AuthCallout bool
	Embedded    EmbeddedOptions
	// Stages to run: stage names and Control. Empty means all of them.
	Stages []string
	// Workers per stage.
	Workers int
	// TenantInFlight is the most calls of one tenant an execute process runs
	// at once (execute.TenantQuota); 0 is three quarters of Workers (at
	// least one), a negative value no limit.
	TenantInFlight int
	// MetricsAddr serves Prometheus metrics at /metrics when set.
	MetricsAddr string
	// OTLPEndpoint exports traces over OTLP/HTTP when set: a URL or host:port.
	OTLPEndpoint string
	// PolicyPath is a .rego file or a directory of them; empty uses the shipped policy.
	PolicyPath string
	// DetectorRulesPath replaces the shipped detector rules (JSON, see
	// schemas/detector-rules.schema.json).
	DetectorRulesPath string
	// SafetyConfigPath holds per-tenant output actions:
	// {"tenants": {"acme": {"pii": "reject"}}}.
	SafetyConfigPath string
	// Examples registers the example tools at start and, unless JWKSPath
	// is set, creates a development signing key in DevKeyDir and mints a
	// development token (Node.DevToken) for the example tenant.
	Examples bool
	// DevKeyDir holds the development key; default: Embedded.DataDir.
	DevKeyDir string
	// JWKSPath is the key set capability tokens are verified with; the
	// file is reloaded when it changes.
	JWKSPath string
	// TokenIssuer and TokenAudience are pinned; default "toolgate".
	TokenIssuer   string
	TokenAudience string
	// TokenMaxLifetime bounds a capability token's exp − iat; zero is
	// token.DefaultMaxLifetime.
	TokenMaxLifetime time.Duration
	// AuditCheck is how often the AUDIT stream is checked for and created
	// again when missing (besides when JetStream announces its deletion);
	// default 10s.
	AuditCheck time.Duration
	// ApprovalSweep is how often deadlines of pending approvals are checked.
	ApprovalSweep time.Duration
	// ResetSecuritySettings replaces the cluster's recorded security
	// settings (key set, token issuer and audience, sandbox mode, file root,
	// http private networks) with this process's; without it a process
	// whose settings differ refuses to start (E3951).
	ResetSecuritySettings bool
	Topology              topology.TopologyOptions
	Stage                 StageConfig
	Log                   *slog.Logger
	// Ready, if set, is called once everything runs, with the NATS URL.
	Ready func(url string, n *Node)
}

// Run runs the configured stages until ctx is done, then drains: each
// runner stops fetching, finishes what it holds, and Run returns.
func Run(ctx context.Context, c Config) error {
	log := c.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if len(c.Stages) == 0 {
		c.Stages = append(append([]string{}, subjects.Stages...), Control)
	}
	if err := resolvePaths(&c); err != nil {
		return err
	}
	url := c.NATSURL
	var gate *Gate
	var connOpts []nats.Option
	var credsPath string // the credentials this process connects with
	if url == "" {
		ns, keys, err := StartSecureEmbedded(c.Embedded)
		if err != nil {
			return err
		}
		defer func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		}()
		url = ns.ClientURL()
		if gate, err = StartGate("", keys, log, nats.InProcessServer(ns)); err != nil {
			return err
		}
		defer gate.Close()
		credsPath = CredsPath(c.Embedded.DataDir, busauth.RoleWorker)
		connOpts = append(connOpts, nats.InProcessServer(ns), busauth.CredentialsOption(credsPath))
		log.Info("embedded NATS started", "url", url, "data", c.Embedded.DataDir)
	} else {
		creds := c.Creds
		if def := CredsPath(c.Embedded.DataDir, busauth.RoleWorker); creds == "" && c.Embedded.DataDir != "" {
			if _, err := os.Stat(def); err == nil {
				creds = def
			}
		}
		if creds != "" {
			credsPath = creds
			connOpts = append(connOpts, busauth.CredentialsOption(creds))
		}
		if c.AuthCallout {
			keys, err := busauth.LoadKeys(c.Embedded.DataDir)
			if err != nil {
				return fmt.Errorf("auth callout: %w", err)
			}
			if gate, err = StartGate(url, keys, log); err != nil {
				return err
			}
			defer gate.Close()
		}
	}
	if c.OTLPEndpoint != "" {
		shutdown, err := setupTracing(ctx, c.OTLPEndpoint)
		if err != nil {
			return err
		}
		defer shutdown()
	}

	// Two contexts: ctx ending starts the drain (runners stop fetching and
	// finish what they hold); runCtx carries what the in-flight work needs
	// (MCP servers, watches, the approval sweeper) and ends only after the
	// drain, when Run closes and joins it all.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	// Metrics and health are served from the start: alive while waiting for
	// the topology, ready once the stages run.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := runner.NewMetrics(reg)
	if c.Stage.ModelStats == nil {
		c.Stage.ModelStats = modeltool.NewStats(reg)
	}
	var health Health
	if c.MetricsAddr != "" {
		srv := &http.Server{Addr: c.MetricsAddr, Handler: health.Handler(reg), ReadHeaderTimeout: 5 * time.Second}
		served := make(chan struct{})
		go func() {
			defer close(served)
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server", "err", err)
			}
		}()
		defer func() { _ = srv.Close(); <-served }()
	}
	// A signal while waiting for the topology stops the wait: nothing runs yet.
	stopWaiting := context.AfterFunc(ctx, cancel)
	n, err := Open(runCtx, url, "toolgate", c.Topology, log, connOpts...)
	stopWaiting()
	if err != nil {
		return err
	}
	var bg sync.WaitGroup // goroutines on runCtx
	defer func() {
		n.StopStages()
		cancel()
		bg.Wait()
		n.Store.Wait()
		n.Close()
	}()
	if c.Examples {
		if err := n.RegisterExamples(ctx); err != nil {
			return err
		}
	}
	if err := loadSafety(&c); err != nil {
		return err
	}
	if err := setupTokens(runCtx, &c, n, log, &bg); err != nil {
		return err
	}
	if err := checkSecurity(ctx, &c, n, c.ResetSecuritySettings, log); err != nil {
		return err
	}
	if err := n.GuardAudit(runCtx, cmp.Or(c.AuditCheck, 10*time.Second)); err != nil {
		return err
	}
	if gate != nil {
		v := c.Stage.Tokens
		if v == nil {
			v = &token.Verifier{Keys: token.StaticKeys{}} // no key set: every agent refused
		}
		if err := gate.Attach(runCtx, v, n); err != nil {
			return err
		}
	}
	if c.PolicyPath != "" && c.Stage.Policy == nil {
		if c.Stage.Policy, err = loadPolicy(ctx, c.PolicyPath); err != nil {
			return err
		}
	}

	approvals := &approval.Service{Store: n.Store, JS: n.JS, Log: log}
	var runners []*runner.Runner
	for _, name := range c.Stages {
		if name == AuthCallout {
			continue
		}
		if name == Control {
			var opts []control.Option
			if credsPath != "" {
				id, err := decidersFrom(credsPath)
				if err != nil {
					return err
				}
				opts = append(opts, control.WithDeciders(id))
			}
			svc, err := control.Start(n.NC, n.Store, n.Registry, approvals, opts...)
			if err != nil {
				return err
			}
			defer func() { _ = svc.Stop() }()
			continue
		}
		if name == subjects.Authorize {
			bg.Go(func() { approvals.RunSweeper(runCtx, cmp.Or(c.ApprovalSweep, time.Second)) })
		}
		c.Stage.TenantInFlight = tenantQuota(c.TenantInFlight, c.Workers)
		st, err := n.NewStage(runCtx, name, c.Stage)
		if err != nil {
			return err
		}
		runners = append(runners, n.Runner(name, st, c.Workers, metrics))
	}

	// Runners stop fetching when drain is done, then finish in-flight work;
	// one failing stops the others, and so does a connection that closes for
	// good, which Run then reports so a supervisor restarts the process.
	drain, stop := context.WithCancel(ctx)
	defer stop()
	errs := make(chan error, len(runners)+1)
	bg.Go(func() {
		select {
		case <-n.Lost():
			log.Error("NATS connection closed for good; stopping", "err", n.NC.LastError())
			stop()
		case <-runCtx.Done():
		}
	})
	var wg sync.WaitGroup
	for _, r := range runners {
		wg.Go(func() {
			if err := r.Run(drain); err != nil {
				errs <- fmt.Errorf("stage %s: %w", r.Name, err)
				stop()
			}
		})
	}
	for _, r := range runners {
		health.Watch(r.Stalled)
	}
	health.SetReady(n.NC)
	log.Info("toolgate running", "stages", c.Stages, "workers", c.Workers, "nats", url)
	if c.Ready != nil {
		c.Ready(url, n)
	}
	// Wait for the signal even when no runner runs (stage control serves
	// requests on its own goroutines).
	<-drain.Done()
	wg.Wait()
	// The closed handler runs asynchronously: ask the connection itself.
	if n.NC.IsClosed() {
		errs <- fmt.Errorf("%w: %v", ErrConnectionClosed, n.NC.LastError())
	}
	close(errs)
	log.Info("toolgate stopped: in-flight work drained")
	return errors.Join(collect(errs)...)
}

// TokenLeeway is the clock skew the verifiers tolerate on exp, nbf and iat.
const TokenLeeway = 30 * time.Second

// setupTokens configures capability token verification: the operator's key
// set, or with Examples and no key set, a development key.
func setupTokens(ctx context.Context, c *Config, n *Node, log *slog.Logger, bg *sync.WaitGroup) error {
	if c.Stage.Tokens != nil {
		return nil
	}
	iss, aud := cmp.Or(c.TokenIssuer, "toolgate"), cmp.Or(c.TokenAudience, "toolgate")
	switch {
	case c.JWKSPath != "":
		kf, err := token.OpenKeyFile(c.JWKSPath, log)
		if err != nil {
			return fmt.Errorf("key set: %w", err)
		}
		bg.Go(func() { kf.Watch(ctx, time.Second) })
		c.Stage.Tokens = &token.Verifier{Keys: kf, Issuer: iss, Audience: aud, Leeway: TokenLeeway, MaxLifetime: c.TokenMaxLifetime}
	case c.Examples:
		dir := cmp.Or(c.DevKeyDir, c.Embedded.DataDir)
		if dir == "" {
			return errors.New("examples: no directory for the development key (set DevKeyDir or the data directory)")
		}
		k, raw, err := devKeys(dir, iss, aud)
		if err != nil {
			return fmt.Errorf("development key: %w", err)
		}
		n.DevToken = raw
		c.Stage.Tokens = &token.Verifier{Keys: token.StaticKeys{Set: k.KeySet()}, Issuer: iss, Audience: aud, Leeway: TokenLeeway, MaxLifetime: c.TokenMaxLifetime}
		if cl, err := c.Stage.Tokens.Verify(raw); err == nil {
			n.DevInboxPrefix = busauth.InboxPrefix(cl.TenantID, cl.ID)
		}
		log.Info("development signing key in use: not for production", "dir", dir)
	}
	return nil
}

func collect(ch <-chan error) []error {
	var out []error
	for err := range ch {
		out = append(out, err)
	}
	return out
}

func loadSafety(c *Config) error {
	if c.DetectorRulesPath != "" {
		b, err := os.ReadFile(c.DetectorRulesPath)
		if err != nil {
			return fmt.Errorf("detector rules: %w", err)
		}
		if c.Stage.Detectors, err = detect.Load(b); err != nil {
			return err
		}
	}
	if c.SafetyConfigPath != "" {
		b, err := os.ReadFile(c.SafetyConfigPath)
		if err != nil {
			return fmt.Errorf("safety config: %w", err)
		}
		var doc struct {
			Tenants map[string]map[string]string `json:"tenants"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			return fmt.Errorf("safety config %s: %w", c.SafetyConfigPath, err)
		}
		for tenant := range doc.Tenants {
			if err := subjects.CheckTenant(tenant); err != nil {
				return fmt.Errorf("safety config %s: %w", c.SafetyConfigPath, err)
			}
		}
		c.Stage.TenantActions = doc.Tenants
	}
	for tenant := range c.Stage.RateLimits {
		if err := subjects.CheckTenant(tenant); err != nil {
			return fmt.Errorf("rate limit overrides: %w", err)
		}
	}
	return nil
}

func loadPolicy(ctx context.Context, path string) (*policy.Engine, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if fi.IsDir() {
		return policy.LoadDir(ctx, path)
	}
	return policy.LoadFile(ctx, path)
}

// setupTracing installs an OTLP/HTTP exporter as the global tracer provider.
// endpoint is a URL (http://collector:4318, https://… for TLS) or host:port
// (plain HTTP). When it is the value of OTEL_EXPORTER_OTLP_ENDPOINT the
// exporter reads that and the other OTEL_EXPORTER_OTLP_* variables itself
// (path /v1/traces appended, certificates, headers), as every OTel SDK does.
// The resource honours OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
func setupTracing(ctx context.Context, endpoint string) (func(), error) {
	var opts []otlptracehttp.Option
	switch {
	case endpoint == os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"):
	case strings.Contains(endpoint, "://"):
		u, err := url.Parse(endpoint)
		if err != nil {
			return nil, fmt.Errorf("tracing: endpoint: %w", err)
		}
		if u.Path == "" || u.Path == "/" {
			u.Path = "/v1/traces"
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
	default:
		opts = append(opts, otlptracehttp.WithEndpoint(endpoint), otlptracehttp.WithInsecure())
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	// Later detectors win: the environment overrides the default name.
	res, err := resource.New(ctx, resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", "toolgate")), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(ctx)
	}, nil
}
