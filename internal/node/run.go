package node

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/control"
	"github.com/toolgate/toolgate/internal/detect"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
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

// DefaultInFlight is Config.InFlight's default.
const DefaultInFlight = 64

// DefaultWorkers is Config.Workers' default: the calls an execute process
// runs at once. Tools mostly wait (on HTTP APIs, models, MCP servers), so
// the bound is memory, not CPU (docs/operations.md weighs it).
const DefaultWorkers = 256

// AuthCallout is the pseudo-stage name of the bus's auth callout alone
// (Config.AuthCallout, for external servers).
const AuthCallout = "authcallout"

// Config configures Run.
type Config struct {
	// NATSURL is the server to use; empty starts an embedded one, always
	// with bus authentication (docs/security.md).
	NATSURL string
	// Creds is the credentials file (busauth.IssueCredentials) a process
	// running one stage (or only the control service) connects to NATSURL
	// with. Without it each stage connects with its own role's
	// <stage>.creds in Embedded.DataDir/busauth, when it is there; a bus
	// without authentication takes none.
	Creds string
	// ControlCreds is the credentials file the control service (and, with
	// Examples, the registration of the example tools) connects with when
	// this process runs more than the control service; default: the
	// control.creds serve wrote in Embedded.DataDir/busauth, when it is
	// there. A process running only the control service uses Creds.
	ControlCreds string
	// OperatorCreds are operator credentials this process sets up the
	// topology with (streams, consumers, buckets and their republishing)
	// and keeps the audit trail guarded with; default: the data
	// directory's operator.creds, when it is there (serve writes it). A
	// process without them binds to the topology the operator made.
	OperatorCreds string
	// AuthCallout runs the bus's auth callout against NATSURL too, with
	// the keys in Embedded.DataDir/busauth (as the embedded server does);
	// several instances share the work in a queue group.
	AuthCallout bool
	Embedded    EmbeddedOptions
	// Stages to run: stage names and Control. Empty means all of them.
	Stages []string
	// Workers is how many calls execute runs at once per process, its
	// capacity; default DefaultWorkers. With the tenant quota on, up to
	// execute.Headroom more run for tenants below their share, so a
	// tenant arriving behind another's backlog starts at once.
	Workers int
	// InFlight is the most messages each stage but execute holds and
	// processes at once, including those waiting for their publishes to be
	// acknowledged. Default DefaultInFlight. Execute holds one message per
	// running call.
	InFlight int
	// TenantInFlight caps one tenant's share of execute's Workers while
	// other tenants run calls (execute.TenantQuota); 0 is an equal share,
	// a negative value turns the quota off. A tenant alone may use them all.
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
	// DefaultsPath holds the defaults where a manifest is silent, for the
	// deployment and per tenant (LoadDefaults), replacing the
	// specification's member by member.
	DefaultsPath string
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
	// GrantKeyPath is a private JWK the control service signs the child
	// tokens of granted capability requests with; its public key must be in
	// the key set (JWKSPath). GrantSigner is the same, already loaded; with
	// Examples and neither, the development key signs. Without any,
	// capability requests are matched but never granted.
	GrantKeyPath string
	GrantSigner  *token.SigningKey
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
	// Site runs this process as site Site (docs/sites.md): an execute
	// worker behind a leaf node of the hub at Hub, whose link
	// authenticates with Creds (the site's credentials). Embedded.DataDir
	// holds the site's bundle (toolgate site add).
	Site string
	Hub  string
	// SiteRate bounds the messages a second the hub forwards from each
	// site's outbox (0 or less: DefaultSiteRate; serve --site-rate).
	SiteRate int
	// Ready, if set, is called once everything runs, with the NATS URL.
	Ready func(url string, n *Node)
}

// Run runs the configured stages until ctx is done, then drains: each
// runner stops fetching, finishes what it holds, and Run returns.
func Run(ctx context.Context, c Config) error {
	if err := resolvePaths(&c); err != nil {
		return err
	}
	c = c.withDefaults()
	if err := c.Validate(); err != nil {
		return err
	}
	r := &run{c: c, log: c.Log}
	return r.run(ctx)
}

// run is what Run's phases build up and hand on to the next.
type run struct {
	c   Config
	log *slog.Logger

	// startBus
	url           string
	gate          *Gate         // the auth callout, when this process runs it
	base          []nats.Option // every connection's, before its role's credentials
	roleCreds     map[busauth.Role]string
	opCreds       string // the operator's credentials, when this process has them
	authenticated bool   // the bus authenticates: some role has credentials
	credsPath     string // the credentials this process's proofs are read from

	// mintDevKey: the development key and token, written before the bus
	// listens so that whoever waits for the port finds the token there.
	devKey   *token.SigningKey
	devToken string

	// startObservability
	runCtx  context.Context // what in-flight work needs: ends after the drain
	cancel  context.CancelFunc
	metrics *runner.Metrics
	reg     *prometheus.Registry
	health  Health

	// openConnections
	nodes *nodeSet
	op    *Node          // the operator's connection, when this process has one
	bg    sync.WaitGroup // goroutines on runCtx

	// startStages
	runners []*runner.Runner
}

// run runs the phases in order; each returns what undoes it, deferred so
// that they undo in reverse.
func (r *run) run(ctx context.Context) error {
	if err := r.mintDevKey(); err != nil {
		return err
	}
	stopBus, err := r.startBus()
	if err != nil {
		return err
	}
	defer stopBus()
	if err := r.loadKeys(); err != nil {
		return err
	}
	stopObservability, err := r.startObservability(ctx)
	if err != nil {
		return err
	}
	defer stopObservability()
	closeConnections, err := r.openConnections(ctx)
	if err != nil {
		return err
	}
	defer closeConnections()
	if err := r.ensureSites(ctx); err != nil {
		return err
	}
	if err := r.registerExamples(ctx); err != nil {
		return err
	}
	if err := r.setupAdmission(ctx); err != nil {
		return err
	}
	stopStages, err := r.startStages(ctx)
	if err != nil {
		return err
	}
	defer stopStages()
	return r.serve(ctx)
}

// mintDevKey writes the development key and token (Examples without a key
// set) before anything listens: a script that waits for the port and then
// reads the token must find it.
func (r *run) mintDevKey() error {
	c := &r.c
	if !c.Examples || c.JWKSPath != "" || c.Stage.Tokens != nil {
		return nil
	}
	k, raw, err := devKeys(c.DevKeyDir, c.TokenIssuer, c.TokenAudience) // Validate made sure there is a dir
	if err != nil {
		return fmt.Errorf("development key: %w", err)
	}
	r.devKey, r.devToken = k, raw
	return nil
}

// startBus starts the embedded server, or against an external one the auth
// callout when this process runs it, and settles the credentials each role
// connects with. Each stage and the control service connect apart, each
// with its own role's credentials (roleOpts); the operator's connection,
// when this process has operator credentials, sets up the topology first.
func (r *run) startBus() (stop func(), err error) {
	c, log := &r.c, r.log
	stop = func() {}
	r.url = c.NATSURL
	r.roleCreds = map[busauth.Role]string{}
	if c.Site != "" {
		return r.startSite()
	}
	if r.url == "" {
		ns, g, err := StartSecureEmbedded(c.Embedded, log)
		if err != nil {
			return nil, err
		}
		stop = func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		}
		r.url = ns.ClientURL()
		r.gate = g
		if js := ns.JetStreamConfig(); js != nil {
			// What the store can still reserve: the streams made now fit
			// in it (topology.TopologyOptions.StoreRoom).
			_, reserved, _ := ns.JetStreamReservedResources()
			c.Topology.StoreRoom = max(js.MaxStore-reserved, 1)
		}
		r.base = append(r.base, nats.InProcessServer(ns))
		for _, role := range busauth.IssuedRoles {
			r.roleCreds[role] = CredsPath(c.Embedded.DataDir, role)
		}
		r.opCreds = r.roleCreds[busauth.RoleOperator]
		log.Info("embedded NATS started", "url", r.url, "data", c.Embedded.DataDir)
	} else {
		onDisk := func(role busauth.Role) string {
			if c.Embedded.DataDir == "" {
				return ""
			}
			p := CredsPath(c.Embedded.DataDir, role)
			if _, err := os.Stat(p); err != nil {
				return ""
			}
			return p
		}
		for _, role := range busauth.IssuedRoles {
			r.roleCreds[role] = onDisk(role)
		}
		if c.Creds != "" {
			own := c.Stages
			if slices.Contains(own, AuthCallout) {
				own = slices.DeleteFunc(slices.Clone(own), func(s string) bool { return s == AuthCallout })
			}
			switch { // Validate refuses any other count
			case len(own) == 0 && c.AuthCallout:
				// The callout alone audits refusals and follows
				// revocations as the control service does.
				r.roleCreds[busauth.RoleControl] = c.Creds
			case len(own) == 1:
				r.roleCreds[busauth.Role(own[0])] = c.Creds
			}
		}
		if c.ControlCreds != "" {
			r.roleCreds[busauth.RoleControl] = c.ControlCreds
		}
		r.opCreds = cmp.Or(c.OperatorCreds, r.roleCreds[busauth.RoleOperator])
		if c.AuthCallout {
			keys, err := busauth.LoadKeys(c.Embedded.DataDir)
			if err != nil {
				return nil, fmt.Errorf("auth callout: %w", err)
			}
			// The server has accounts for the declared tenants only.
			tenants, err := busauth.LoadTenants(c.Embedded.DataDir)
			if err != nil {
				return nil, fmt.Errorf("auth callout: %w", err)
			}
			if len(tenants) == 0 {
				log.Warn("auth callout: no tenants declared: every agent is refused", "declare", filepath.Join(c.Embedded.DataDir, busauth.DirName, busauth.TenantsFile))
			}
			if r.gate, err = StartGate(r.url, keys, tenants, log); err != nil {
				return nil, err
			}
			stop = r.gate.Close
		}
	}
	if c.OperatorCreds != "" {
		r.opCreds = c.OperatorCreds
	}
	for _, p := range r.roleCreds {
		r.authenticated = r.authenticated || p != ""
	}
	for _, name := range c.Stages {
		if role, ok := busauth.StageRole(name); ok && r.roleCreds[role] != "" {
			r.credsPath = r.roleCreds[role]
			break
		}
	}
	if r.credsPath == "" {
		r.credsPath = r.roleCreds[busauth.RoleControl]
	}
	return stop, nil
}

// roleOpts are the options role r connects with: its own credentials.
func (r *run) roleOpts(role busauth.Role) []nats.Option {
	if p := r.roleCreds[role]; p != "" {
		return append(slices.Clone(r.base), busauth.CredentialsOption(p))
	}
	return r.base
}

// loadKeys loads what the stages seal, sign and verify with from the
// deployment's keys and credentials: the hop seals, the audit chain key,
// and on an authenticated bus the proofs of operators' signatures.
func (r *run) loadKeys() error {
	c, log := &r.c, r.log
	if err := setupSeals(c, r.authenticated, log); err != nil {
		return err
	}
	if err := setupAuditChain(c, log); err != nil {
		return err
	}
	if r.authenticated && c.Stage.StateProof == nil {
		v, err := stateProofs(r.credsPath)
		if err != nil {
			return err
		}
		c.Stage.StateProof = v
	}
	if r.authenticated && slices.Contains(c.Stages, subjects.Authorize) && c.Stage.ApprovalProof == nil {
		proofs, err := approvalProofs(r.credsPath)
		if err != nil {
			return err
		}
		c.Stage.ApprovalProof = proofs
	}
	return nil
}

// startObservability starts tracing, and serves metrics and health from
// the start: alive while waiting for the topology, ready once the stages
// run. It also makes runCtx, the second of Run's two contexts: ctx ending
// starts the drain (runners stop fetching and finish what they hold);
// runCtx carries what the in-flight work needs (MCP servers, watches, the
// approval sweeper) and ends only after the drain, when Run closes and
// joins it all.
func (r *run) startObservability(ctx context.Context) (stop func(), err error) {
	c, log := &r.c, r.log
	var undo []func() // in reverse
	stop = func() {
		for _, f := range slices.Backward(undo) {
			f()
		}
	}
	if c.OTLPEndpoint != "" {
		shutdown, err := setupTracing(ctx, c.OTLPEndpoint)
		if err != nil {
			return nil, err
		}
		undo = append(undo, shutdown)
	}
	r.runCtx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	undo = append(undo, r.cancel)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(gcCPU)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	r.reg = reg
	// A site's metrics carry its name, so the hub's Prometheus tells the
	// sites' workers apart.
	var regr prometheus.Registerer = reg
	if c.Site != "" {
		regr = prometheus.WrapRegistererWith(prometheus.Labels{"site": c.Site}, reg)
	}
	r.metrics = runner.NewMetrics(regr)
	if c.Stage.ModelStats == nil {
		c.Stage.ModelStats = modeltool.NewStats(regr)
	}
	if c.Stage.ShadowMetrics == nil {
		c.Stage.ShadowMetrics = NewShadowMetrics(regr)
	}
	if c.Stage.AuditChainMetrics == nil {
		c.Stage.AuditChainMetrics = NewAuditChainMetrics(regr)
	}
	if c.Stage.AuditArchiveMetrics == nil {
		c.Stage.AuditArchiveMetrics = NewAuditArchiveMetrics(regr)
	}
	if c.Stage.AuditOTLPMetrics == nil {
		c.Stage.AuditOTLPMetrics = NewAuditOTLPMetrics(regr)
	}
	if c.MetricsAddr != "" {
		srv := &http.Server{Addr: c.MetricsAddr, Handler: r.health.Handler(reg), ReadHeaderTimeout: 5 * time.Second}
		served := make(chan struct{})
		go func() {
			defer close(served)
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server", "err", err)
			}
		}()
		undo = append(undo, func() { _ = srv.Close(); <-served })
	}
	return stop, nil
}

// openConnections connects each role this process runs (openNodes) and
// gives each its signing key (setupSigning). Closing stops the stages,
// ends runCtx, joins the goroutines on it, then closes the connections.
func (r *run) openConnections(ctx context.Context) (closeAll func(), err error) {
	c, log := &r.c, r.log
	// A signal while waiting for the topology stops the wait: nothing runs yet.
	stopWaiting := context.AfterFunc(ctx, r.cancel)
	r.nodes, r.op, err = openNodes(r.runCtx, r.url, c, r.authenticated, r.opCreds, r.roleOpts, r.base, r.gate != nil, log)
	stopWaiting()
	if err != nil {
		return nil, err
	}
	closeAll = func() {
		for _, nd := range r.nodes.all() {
			nd.StopStages()
		}
		r.cancel()
		r.bg.Wait()
		for _, nd := range r.nodes.all() {
			nd.Store.Wait()
			nd.Close()
		}
	}
	if err := setupSigning(c, r.nodes, r.authenticated); err != nil {
		closeAll()
		return nil, err
	}
	if dir := c.Embedded.DataDir; c.Site == "" && dir != "" && c.Stage.SiteDeclared == nil {
		// Route sends no call to a site the hub no longer declares.
		c.Stage.SiteDeclared = func(site string) bool {
			sites, err := busauth.LoadSites(dir)
			return err != nil || slices.Contains(sites, site) // unreadable: let the call wait, as before
		}
	}
	r.operatorRecords()
	return closeAll, nil
}

// operatorRecords has the operator's connection, which may not publish
// audit events, record what it must through another role: a recreated
// AUDIT and the state its readers ignored go on the relay as the control
// service's, where audit checks them and publishes them as its own (so
// the audit chain counts them as audit's), or, without a control service,
// through the audit stage's connection.
func (r *run) operatorRecords() {
	op := r.op
	if op == nil || !r.authenticated {
		return
	}
	var rec *Node
	if r.nodes.control != nil {
		rec = r.nodes.control
	} else if an := r.nodes.stage[subjects.Audit]; an != nil {
		rec = an
	}
	if rec == nil || rec == op {
		return
	}
	op.AuditRecorder = rec.JS
	op.refusals.Store(&jsBox{rec.JS})
}

// registerExamples registers the example tools, with Examples, and waits
// until the stages' registries hold them too, before calls come.
func (r *run) registerExamples(ctx context.Context) error {
	c, ctl := &r.c, r.nodes.control
	if !c.Examples {
		return nil
	}
	var sign *exampleSigner
	if c.Stage.StateProof != nil {
		// The examples are the operator's: signed with its credentials.
		if r.opCreds == "" {
			return errors.New("--examples on an authenticated bus needs the operator's credentials to sign them")
		}
		sg, err := busauth.SignerFromCreds(r.opCreds)
		if err != nil {
			return err
		}
		sign = &exampleSigner{signer: sg, verify: c.Stage.StateProof}
	}
	if err := ctl.registerExamples(ctx, sign); err != nil {
		return err
	}
	// The stages' registries must hold them too before calls come.
	ms, err := tools.Examples()
	if err != nil {
		return err
	}
	for _, nd := range r.nodes.all() {
		if nd == ctl || nd.Role == busauth.RoleOperator || (nd.Role != "" && !slices.Contains(busauth.Rights[nd.Role].Watches, subjects.BucketTools)) {
			continue
		}
		for _, m := range ms {
			if err := nd.WaitForTool(ctx, m.ID, m.Version); err != nil {
				return err
			}
		}
	}
	return nil
}

// setupAdmission sets up what decides which calls get in and what they
// may do: the safety rules, the capability token verifier, the cluster's
// security settings, the audit stream's guard, the auth callout's
// verifier and the policy.
func (r *run) setupAdmission(ctx context.Context) error {
	c, log := &r.c, r.log
	if err := loadSafety(c); err != nil {
		return err
	}
	if err := setupTokens(r.runCtx, c, r.nodes.first(r.op), log, &r.bg, r.devKey, r.devToken); err != nil {
		return err
	}
	if err := checkSecurity(ctx, c, r.nodes.stage, c.ResetSecuritySettings, log); err != nil {
		return err
	}
	if r.op != nil {
		// Recreating a deleted audit stream is the operator's; recording
		// it is another role's (operatorRecords).
		if err := r.op.GuardAudit(r.runCtx, c.AuditCheck); err != nil {
			return err
		}
	}
	if r.gate != nil {
		v := c.Stage.Tokens
		if v == nil {
			v = &token.Verifier{Keys: token.StaticKeys{}} // no key set: every agent refused
		}
		if err := r.gate.Attach(r.runCtx, v, r.nodes.control); err != nil {
			return err
		}
	}
	if c.PolicyPath != "" && c.Stage.Policy == nil {
		var err error
		if c.Stage.Policy, err = loadPolicy(ctx, c.PolicyPath); err != nil {
			return err
		}
	}
	return nil
}

// startStages starts the control service and builds each stage and its
// runner, in c.Stages' order; the runners run in serve. Stopping stops the
// control service.
func (r *run) startStages(ctx context.Context) (stop func(), err error) {
	c := &r.c
	var stops []func()
	stop = func() {
		for _, f := range slices.Backward(stops) {
			f()
		}
	}
	// Every stage is built with the same config: execute's share of this
	// process's calls is settled here, once.
	capacity, tenantCap, slots := executeSlots(c)
	c.Stage.Concurrency, c.Stage.TenantInFlight = capacity, tenantCap
	kept, err := r.redrive(ctx)
	if err != nil {
		return nil, err
	}
	if kept {
		c.Stage.HopsSince = time.Now()
	}
	// The stages of this process hand invocations to each other in memory
	// as well as on the bus, so the reader need not decode what it reads.
	handed := runner.NewHanded(c.Stages)
	for _, name := range c.Stages {
		if name == AuthCallout {
			continue
		}
		if name == Control {
			stopControl, err := r.startControl(ctx)
			if err != nil {
				stop()
				return nil, err
			}
			stops = append(stops, stopControl)
			continue
		}
		sn := r.nodes.stage[name]
		if name == subjects.Authorize {
			approvals := &approval.Service{Store: sn.Store, JS: sn.JS, Log: r.log, EndingTag: sn.Signer.EndingTag}
			r.bg.Go(func() { approvals.RunSweeper(r.runCtx, c.ApprovalSweep) })
		}
		st, err := sn.NewStage(r.runCtx, name, c.Stage)
		if err != nil {
			stop()
			return nil, err
		}
		// Execute holds no more than it runs: its tenant quota judges each
		// message as it is fetched, against the calls running, so a deeper
		// batch would only be put back. Stages other than execute decide
		// from memory and a few KV reads and writes: they wait, so they
		// take as many as they hold.
		workers := slots
		if name != subjects.Execute {
			workers = c.InFlight
		}
		rn := sn.Runner(name, st, workers, r.metrics)
		rn.Handed, rn.KeptIngest = handed, kept
		switch {
		case c.Site != "":
			rn.Inputs = subjects.SiteInputs(c.Site)
			// A site may not read or delete pipeline messages by sequence:
			// the hub's execute settles its consumers' (SweepAlso).
			rn.NoSettle = true
		case name == subjects.Execute && c.Embedded.DataDir != "":
			dir := c.Embedded.DataDir
			rn.SweepAlso = func() []subjects.Input {
				sites, _ := busauth.LoadSites(dir)
				var ins []subjects.Input
				for _, site := range sites {
					ins = append(ins, subjects.SiteInputs(site)...)
				}
				return ins
			}
		}
		r.runners = append(r.runners, rn)
	}
	return stop, nil
}

// redrive, when the invoke stream keeps each call until it ends
// (topology.MemoryHops), sends what it holds to validate again before the
// stages start: the hops live in memory, and this start may follow a
// restart of the server that emptied them (topology.Redrive). It reports
// whether the stream keeps calls. It needs the operator's connection;
// without one the stream is only looked at.
func (r *run) redrive(ctx context.Context) (kept bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if r.op != nil {
		kept, err = topology.Redrive(ctx, r.op.JS)
		if err != nil {
			return false, err
		}
		if kept {
			r.log.Info("re-driving the calls the invoke stream holds from their ingest")
		}
		return kept, nil
	}
	if vn := r.nodes.stage[subjects.Validate]; vn != nil {
		return topology.KeepsInvocations(ctx, vn.JS)
	}
	return false, nil
}

// startControl starts the control service on its own connection.
func (r *run) startControl(ctx context.Context) (stop func(), err error) {
	c, ctl := &r.c, r.nodes.control
	var opts []control.Option
	if ctlCreds := r.roleCreds[busauth.RoleControl]; ctlCreds != "" {
		id, err := decidersFrom(ctlCreds)
		if err != nil {
			return nil, err
		}
		opts = append(opts, control.WithDeciders(id))
	}
	disc, err := discoveryConfig(ctx, c)
	if err != nil {
		return nil, err
	}
	opts = append(opts, control.WithDiscovery(disc))
	if c.Stage.StateProof != nil {
		opts = append(opts, control.WithStateProof(c.Stage.StateProof))
	}
	opts = append(opts, control.WithJetStream(ctl.JS), control.WithManifestCheck(siteCheck(c.Embedded.DataDir, c.Stage.kinds().Check)),
		control.WithSites(func(ctx context.Context, site string) (api.SiteWait, error) {
			st, err := SiteStatus(ctx, ctl.JS, site)
			return api.SiteWait{Site: site, Link: st.Link, LastContact: st.LastContact, Queued: st.Queued}, err
		}))
	if r.gate != nil && r.gate.inProcess != nil {
		// The hub's own control service declares its sites.
		hs := &hubSites{dataDir: c.Embedded.DataDir, auth: r.gate.inProcess, topo: c.Topology}
		if r.op != nil {
			hs.js, hs.retire = r.op.JS, r.retireSite
		}
		opts = append(opts, control.WithSiteAdmin(hs))
	}
	if k := c.Stage.AuditChainKey; k != nil {
		opts = append(opts, control.WithAuditChainKey(k.Public().(ed25519.PublicKey)))
	} else if pub, err := busauth.LoadAuditChainPublicKey(c.Embedded.DataDir); err == nil && c.Embedded.DataDir != "" {
		opts = append(opts, control.WithAuditChainKey(pub))
	}
	if ctl.Signer != nil {
		opts = append(opts, control.WithSigner(ctl.Signer.Sign), control.WithCancelSigner(ctl.Signer.SignCancel))
	}
	if m := c.Stage.Messages; m != nil {
		// Dead letters are the audit stage's: its signature, checked on
		// every read, is what says so.
		opts = append(opts, control.WithDeadLetterCheck(func(subject string, h nats.Header, data []byte) error {
			role, err := m.Sender(subject, h, data)
			if err == nil && role != busauth.RoleAudit {
				err = fmt.Errorf("signed by %s, not by audit", role)
			}
			return err
		}))
	}
	decisions := &approval.Service{Store: ctl.Store, JS: ctl.JS, Log: r.log, EndingTag: ctl.Signer.EndingTag}
	svc, err := control.Start(ctl.NC, ctl.Store, ctl.Registry, decisions, opts...)
	if err != nil {
		return nil, err
	}
	return func() { _ = svc.Stop() }, nil
}

// serve runs the runners and the audit relay until ctx is done, then
// drains. Runners stop fetching when drain is done, then finish in-flight
// work; one failing stops the others, and so does a connection that closes
// for good, which Run then reports so a supervisor restarts the process.
func (r *run) serve(ctx context.Context) error {
	c, log := &r.c, r.log
	drain, stop := context.WithCancel(ctx)
	defer stop()
	errs := make(chan error, len(r.runners)+2)
	r.watchConnections(stop)
	var wg sync.WaitGroup
	for _, rn := range r.runners {
		wg.Go(func() {
			if err := rn.Run(drain); err != nil {
				errs <- fmt.Errorf("stage %s: %w", rn.Name, err)
				stop()
			}
		})
	}
	if an := r.nodes.stage[subjects.Audit]; an != nil {
		relay := &runner.Relay{JS: an.JS, Senders: an.Senders, Log: log, Metrics: r.metrics}
		wg.Go(func() {
			if err := relay.Run(drain); err != nil {
				errs <- err
				stop()
			}
		})
	}
	for _, rn := range r.runners {
		r.health.Watch(rn.Stalled)
	}
	r.health.SetReady(r.nodes.first(nil).NC)
	log.Info("toolgate running", "stages", c.Stages, "workers", c.Workers, "nats", r.url)
	if c.Ready != nil {
		c.Ready(r.url, r.nodes.first(r.op)) // the operator's node when there is one
	}
	// Wait for the signal even when no runner runs (stage control serves
	// requests on its own goroutines).
	<-drain.Done()
	wg.Wait()
	return r.drain(errs)
}

// watchConnections stops the runners when a connection closes for good.
func (r *run) watchConnections(stop func()) {
	for _, nd := range r.nodes.all() {
		if nd.Lost() == nil {
			continue
		}
		r.bg.Go(func() {
			select {
			case <-nd.Lost():
				r.log.Error("NATS connection closed for good; stopping", "role", nd.Role, "err", nd.NC.LastError())
				stop()
			case <-r.runCtx.Done():
			}
		})
	}
}

// drain ends serve once the runners have stopped: the stages give back
// what they hold, and Run reports what failed, a lost connection included.
func (r *run) drain(errs chan error) error {
	release(r.runners, r.log)
	// The closed handler runs asynchronously: ask the connections themselves.
	for _, nd := range r.nodes.all() {
		if nd.NC.IsClosed() && nd.Lost() != nil {
			errs <- fmt.Errorf("%w: %v", ErrConnectionClosed, nd.NC.LastError())
			break
		}
	}
	close(errs)
	r.log.Info("toolgate stopped: in-flight work drained")
	return errors.Join(collect(errs)...)
}

// releaser is a stage that holds shared capacity (authorize's budget
// leases) to give back when it stops.
type releaser interface {
	Release(ctx context.Context) error
}

// release has the stopped runners' stages give back what they hold; a
// stage that cannot (the connection is gone) leaves it counted as used.
func release(runners []*runner.Runner, log *slog.Logger) {
	for _, r := range runners {
		if rel, ok := r.Stage.(releaser); ok {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if err := rel.Release(ctx); err != nil {
				log.Warn("leased budget calls not returned; they count as used", "stage", r.Name, "err", err)
			}
			cancel()
		}
	}
}

// setupSeals loads the deployment's hop-sealing key from the data
// directory for the stages that use it: the private key for authorize, the
// public key for execute. The key is made where the deployment's other bus
// keys are (serve writes them; an older data directory gets one); anywhere
// else a new key would only be one the other workers do not trust. On an
// authenticated bus authorize and execute do not start without their half:
// a hop execute cannot check is one anyone with pipeline rights could have
// written. Only a bus without authentication runs unsealed, with a warning.
func setupSeals(c *Config, authenticated bool, log *slog.Logger) error {
	runs := func(stage string) bool { return slices.Contains(c.Stages, stage) }
	dir := c.Embedded.DataDir
	where := filepath.Join(dir, busauth.DirName)
	if runs(subjects.Authorize) && c.Stage.Sealer == nil {
		var k ed25519.PrivateKey
		err := fs.ErrNotExist
		if dir != "" {
			k, err = busauth.LoadSealKey(dir)
			if errors.Is(err, fs.ErrNotExist) && busauth.HasKeys(dir) {
				k, err = busauth.LoadOrCreateSealKey(dir)
			}
		}
		switch {
		case err == nil:
			c.Stage.Sealer = seal.NewSealer(k)
		case authenticated || !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("authorize needs the deployment's hop-sealing key (%s in %s): %w", busauth.SealKeyFile, where, err)
		default:
			log.Warn("authorize hands calls on unsealed: no hop-sealing key and no bus authentication")
		}
	}
	if runs(subjects.Audit) && c.Stage.Sealer == nil && c.Stage.PrincipalSeals == nil && dir != "" {
		// Audit starts a hook's child as the principal of a call authorize
		// sealed only if the seal verifies.
		if pub, err := busauth.LoadSealPublicKey(dir); err == nil {
			c.Stage.PrincipalSeals = seal.NewVerifier(pub)
		} else if authenticated {
			log.Warn("audit starts no hook's retry or fallback of a sealed call: no hop-sealing key", "file", busauth.SealPublicFile, "dir", where, "err", err)
		}
	}
	if runs(subjects.Execute) && c.Stage.Seals == nil {
		var pub ed25519.PublicKey
		err := fs.ErrNotExist
		switch {
		case c.Stage.Sealer != nil:
			c.Stage.Seals = c.Stage.Sealer.Verifier()
			return nil
		case dir != "":
			pub, err = busauth.LoadSealPublicKey(dir)
		}
		switch {
		case err == nil:
			c.Stage.Seals = seal.NewVerifier(pub)
		case authenticated || !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("execute needs the deployment's hop-sealing key (%s in %s): %w", busauth.SealPublicFile, where, err)
		default:
			log.Warn("execute runs unsealed calls: no hop-sealing key and no bus authentication")
		}
	}
	return nil
}

// setupSigning gives each role's connection its signing key, so that
// everything it publishes says who sent it, and has every stage but
// validate (whose input is the agents') check who sent what it reads.
// Like the sealing key, the keys are made where the deployment's other bus
// keys are, and on an authenticated bus nothing starts without them.
func setupSigning(c *Config, nodes *nodeSet, authenticated bool) error {
	if !authenticated {
		return nil // setupSeals said so
	}
	dir := c.Embedded.DataDir
	where := filepath.Join(dir, busauth.DirName)
	if dir != "" && busauth.HasKeys(dir) {
		if err := busauth.LoadOrCreateHopKeys(dir); err != nil {
			return err
		}
	}
	pubs, err := busauth.LoadHopPublicKeys(dir)
	if err != nil {
		return fmt.Errorf("the stages need the deployment's message-signing keys (%s in %s): %w", busauth.HopKeysFile, where, err)
	}
	msgs := seal.NewMessages(pubs)
	msgs.LoadSitesFrom(func() (map[busauth.Role]ed25519.PublicKey, error) { return busauth.LoadHopPublicKeys(dir) })
	trustReceipts(msgs, c.Stage.AuditChainKey, dir)
	c.Stage.Messages = msgs
	for name, n := range nodes.stage {
		r, _ := busauth.StageRole(name)
		if r == busauth.RoleExecute && c.Site != "" {
			r = busauth.SiteRole(c.Site) // the site's own key (site add)
			// What it sends goes through its outbox, signed for where the
			// hub forwards it.
			n.JS = runner.Outboxing(n.JS, c.Site)
		}
		if err := n.signAs(dir, r, msgs, name != subjects.Validate, c.Stage.AuditChainKey != nil); err != nil {
			return err
		}
	}
	if nodes.control != nil {
		if err := nodes.control.signAs(dir, busauth.RoleControl, msgs, false, false); err != nil {
			return err
		}
	}
	if slices.Contains(c.Stages, subjects.Validate) || slices.Contains(c.Stages, subjects.Authorize) {
		k, err := busauth.LoadTokenKey(dir)
		if err != nil {
			return fmt.Errorf("validate and authorize need the deployment's token key (%s in %s): %w", busauth.TokenKeyFile, where, err)
		}
		c.Stage.TokenSeal = seal.NewTokens(k)
	}
	return nil
}

// setupAuditChain loads the key audit signs its checkpoints over AUDIT
// with (docs/audit.md), made where the deployment's other keys are. A
// process without it runs audit unchecked, with a warning: the trail is
// still written, only not made tamper-evident.
func setupAuditChain(c *Config, log *slog.Logger) error {
	if !slices.Contains(c.Stages, subjects.Audit) || c.Stage.AuditChainKey != nil {
		return nil
	}
	dir := c.Embedded.DataDir
	err := fs.ErrNotExist
	var k ed25519.PrivateKey
	if dir != "" {
		k, err = busauth.LoadAuditChainKey(dir)
		if errors.Is(err, fs.ErrNotExist) && busauth.HasKeys(dir) {
			k, err = busauth.LoadOrCreateAuditChainKey(dir)
		}
	}
	switch {
	case err == nil:
		c.Stage.AuditChainKey = k
	case errors.Is(err, fs.ErrNotExist):
		log.Warn("audit writes no checkpoints: no audit chain key", "want", filepath.Join(dir, busauth.DirName, busauth.AuditChainKeyFile))
	default:
		return fmt.Errorf("audit chain key: %w", err)
	}
	return nil
}

// TokenLeeway is the clock skew the verifiers tolerate on exp, nbf and iat.
const TokenLeeway = 30 * time.Second

// setupTokens configures capability token verification: the operator's key
// set, or with Examples and no key set, a development key.
// k and raw are the development key and token when already minted.
func setupTokens(ctx context.Context, c *Config, n *Node, log *slog.Logger, bg *sync.WaitGroup, k *token.SigningKey, raw string) error {
	if c.Stage.Tokens != nil {
		return nil
	}
	iss, aud := c.TokenIssuer, c.TokenAudience
	switch {
	case c.JWKSPath != "":
		kf, err := token.OpenKeyFile(c.JWKSPath, log)
		if err != nil {
			return fmt.Errorf("key set: %w", err)
		}
		bg.Go(func() { kf.Watch(ctx, time.Second) })
		c.Stage.Tokens = &token.Verifier{Keys: kf, Issuer: iss, Audience: aud, Leeway: TokenLeeway, MaxLifetime: c.TokenMaxLifetime}
	case c.Examples:
		dir := c.DevKeyDir // Validate made sure there is one
		if k == nil {
			var err error
			if k, raw, err = devKeys(dir, iss, aud); err != nil {
				return fmt.Errorf("development key: %w", err)
			}
		}
		if c.GrantSigner == nil && c.GrantKeyPath == "" {
			c.GrantSigner = k
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

// LoadDefaults reads a defaults document: the deployment's defaults where
// a manifest is silent, and under "tenants" each tenant's, in the members
// of tools.Defaults, e.g. {"concurrent_tools_per_agent": 8, "tenants":
// {"acme": {"rate_limit": {"requests": 600, "per_seconds": 60}}}}. A member
// it does not know is refused; values are checked by Settings.Check.
func LoadDefaults(b []byte) (tools.Defaults, map[string]tools.Defaults, error) {
	var doc struct {
		tools.Defaults
		Tenants map[string]tools.Defaults `json:"tenants"`
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&doc); err != nil {
		return tools.Defaults{}, nil, api.NewError(api.InvalidParameters, api.EInvalidManifest, "%v", err)
	}
	return doc.Defaults, doc.Tenants, nil
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
	if c.DefaultsPath != "" {
		b, err := os.ReadFile(c.DefaultsPath)
		if err != nil {
			return fmt.Errorf("defaults: %w", err)
		}
		if c.Stage.Defaults, c.Stage.TenantDefaults, err = LoadDefaults(b); err != nil {
			return fmt.Errorf("defaults %s: %w", c.DefaultsPath, err)
		}
	}
	for tenant := range c.Stage.TenantDefaults {
		if err := subjects.CheckTenant(tenant); err != nil {
			return fmt.Errorf("tenant defaults: %w", err)
		}
	}
	if err := c.Stage.settings().Check(); err != nil {
		return err
	}
	for tenant := range c.Stage.RateLimits {
		if err := subjects.CheckTenant(tenant); err != nil {
			return fmt.Errorf("rate limit overrides: %w", err)
		}
	}
	return nil
}

// discoveryConfig is what the control service needs to search by token
// and grant capability requests: the verifier, the grant signing key and
// the grant policy (the operator's policy path when it defines
// toolgate.capability.grant, else the shipped rule).
func discoveryConfig(ctx context.Context, c *Config) (control.Discovery, error) {
	d := control.Discovery{Tokens: c.Stage.Tokens, Signer: c.GrantSigner, MaxLifetime: c.TokenMaxLifetime}
	if c.GrantKeyPath != "" {
		k, err := token.LoadSigningKey(c.GrantKeyPath)
		if err != nil {
			return d, fmt.Errorf("grant key: %w", err)
		}
		d.Signer = k
	}
	var modules map[string]string
	var data map[string]any
	if c.PolicyPath != "" {
		fi, err := os.Stat(c.PolicyPath)
		switch {
		case err != nil:
			return d, fmt.Errorf("policy: %w", err)
		case fi.IsDir():
			if modules, data, err = policy.ReadDir(c.PolicyPath); err != nil {
				return d, err
			}
		default:
			src, err := os.ReadFile(c.PolicyPath)
			if err != nil {
				return d, fmt.Errorf("policy: %w", err)
			}
			modules = map[string]string{filepath.Base(c.PolicyPath): string(src)}
		}
	}
	g, err := policy.NewGrants(ctx, modules, data)
	if err != nil {
		return d, err
	}
	d.Grants = g
	return d, nil
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

// gcCPU adds the collector's CPU time (go_cpu_classes_gc_total_cpu_seconds_total)
// to the Go metrics: its share of a call's cost is what --gc-percent trades
// against memory.
var gcCPU = collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/cpu/classes/gc/total:cpu-seconds$`)}
