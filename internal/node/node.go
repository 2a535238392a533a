package node

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/toolgate/toolgate/api"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/internal/breaker"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/detect"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/hooks"
	"github.com/toolgate/toolgate/internal/modelrouter"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/ratelimit"
	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/internal/secrets"
	"github.com/toolgate/toolgate/internal/signedstate"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/stages/audit"
	"github.com/toolgate/toolgate/stages/authorize"
	"github.com/toolgate/toolgate/stages/execute"
	"github.com/toolgate/toolgate/stages/execute/builtin"
	"github.com/toolgate/toolgate/stages/execute/httptool"
	"github.com/toolgate/toolgate/stages/execute/kind"
	"github.com/toolgate/toolgate/stages/execute/kinds"
	"github.com/toolgate/toolgate/stages/execute/mcptool"
	"github.com/toolgate/toolgate/stages/execute/modeltool"
	"github.com/toolgate/toolgate/stages/route"
	"github.com/toolgate/toolgate/stages/validate"
	"github.com/toolgate/toolgate/stages/verify"
	"github.com/toolgate/toolgate/subjects"
)

// Node is one process's connection to toolgate's NATS topology: streams,
// consumers and buckets ensured, and the tool registry loaded and watched.
type Node struct {
	NC       *nats.Conn
	JS       jetstream.JetStream
	Store    *kvstore.Store
	Registry *tools.Registry
	// Revoked mirrors the revocation bucket.
	Revoked  *token.Revocations
	Topology topology.TopologyOptions
	Log      *slog.Logger
	// Role is the connection's role; empty for the operator's and on a bus
	// without authentication.
	Role busauth.Role
	// Signer signs what this connection's role stores for others to trust
	// (its publishes are signed by JS itself); nil on a bus without
	// authentication.
	Signer *seal.Signer
	// Senders, when set, checks who sent each message the stages of this
	// connection read (runner.Runner.Senders).
	Senders func(subject string, h nats.Header, data []byte) (ours bool, err error)
	// Endings, when set, judges who may end the calls audit reads
	// (runner.Runner.Endings).
	Endings func(signer busauth.Role, inv *envelope.Invocation) error
	// refusals is the JetStream (JS, once signing is set up) through which
	// watches that started with the connection audit what they ignore.
	refusals atomic.Pointer[jsBox]
	// leaves are the audit events this connection published, by sequence,
	// for the audit chain's checkpointer: it reads back only the others.
	leaves *auditchain.Leaves
	// AuditRecorder, when set, is the JetStream GuardAudit records a
	// recreated AUDIT through: audit's own, or a role that emits on the
	// relay. The operator may not publish audit events.
	AuditRecorder jetstream.JetStream
	// DevToken is the development token minted by Run with Examples.
	DevToken string
	// DevInboxPrefix is the inbox prefix an agent connected with DevToken
	// must use (busauth.InboxPrefix).
	DevInboxPrefix string

	lost    chan struct{} // closed when the connection closes for good, unless by Close
	closing atomic.Bool

	stopMu sync.Mutex
	stops  []func() // closers of what NewStage opened
}

// ErrConnectionClosed reports that the NATS connection closed for good (the
// server ended it, say for a protocol error, or reconnecting gave up). The
// process cannot recover without a new connection, so Run returns it and a
// supervisor restarts the process.
var ErrConnectionClosed = errors.New("NATS connection closed")

// Lost is closed when the connection Open made closes for good other than by
// Close; it is nil for a Node opened with OpenConn.
func (n *Node) Lost() <-chan struct{} { return n.lost }

// Open connects to url and makes the topology ready, waiting with backoff
// until ctx is done for a server or topology that is not there yet. The
// registry stays in step with the tools bucket until ctx is done. Open
// creates what is missing: it is for the operator's connection and for a
// bus without authentication; a role binds with OpenRole.
func Open(ctx context.Context, url, name string, topo topology.TopologyOptions, log *slog.Logger, opts ...nats.Option) (*Node, error) {
	return OpenRole(ctx, url, name, "", topo, log, opts...)
}

// OpenRole is Open for a connection of role: it binds to the topology the
// operator made, waiting for it, and opens only the buckets the role may
// use (busauth.Rights). An empty role is Open's.
func OpenRole(ctx context.Context, url, name string, role busauth.Role, topo topology.TopologyOptions, log *slog.Logger, opts ...nats.Option) (*Node, error) {
	return openRole(ctx, url, name, role, topo, nil, log, nil, opts...)
}

// openRole is OpenRole with the kvstore memory the stores of one process
// share (nil: its own), whose registry honours only manifests an operator
// signed when proof is set (signed state, internal/signedstate).
func openRole(ctx context.Context, url, name string, role busauth.Role, topo topology.TopologyOptions, mem *kvstore.Memory, log *slog.Logger,
	proof signedstate.Verify, opts ...nats.Option) (*Node, error) {
	if log == nil {
		log = slog.Default()
	}
	lost := make(chan struct{})
	var n *Node
	var ready sync.WaitGroup
	ready.Add(1)
	// A server that is not up yet is waited for, like a missing topology.
	nc, err := nats.Connect(url, append([]nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true),
		nats.ClosedHandler(func(*nats.Conn) {
			ready.Wait()
			if n == nil || !n.closing.Load() {
				close(lost)
			}
		})}, opts...)...)
	if err != nil {
		ready.Done()
		return nil, fmt.Errorf("connecting to %s: %w", url, err)
	}
	n, err = openConnRole(ctx, nc, role, topo, mem, log, proof)
	if err != nil {
		ready.Done()
		nc.Close()
		return nil, err
	}
	n.lost = lost
	ready.Done()
	return n, nil
}

// OpenConn is Open over an existing connection.
func OpenConn(ctx context.Context, nc *nats.Conn, topo topology.TopologyOptions, log *slog.Logger) (*Node, error) {
	return OpenConnRole(ctx, nc, "", topo, log)
}

// OpenConnRole is OpenRole over an existing connection.
func OpenConnRole(ctx context.Context, nc *nats.Conn, role busauth.Role, topo topology.TopologyOptions, log *slog.Logger) (*Node, error) {
	return openConnRole(ctx, nc, role, topo, nil, log, nil)
}

func openConnRole(ctx context.Context, nc *nats.Conn, role busauth.Role, topo topology.TopologyOptions, mem *kvstore.Memory, log *slog.Logger, proof signedstate.Verify) (*Node, error) {
	if log == nil {
		log = slog.Default()
	}
	// What audit publishes is handed to its checkpointer as acknowledged
	// (inert on connections that run no checkpointer).
	leaves := auditchain.NewLeaves()
	var js jetstream.JetStream
	var err error
	if topo.Site != "" {
		// A site's worker reaches the hub's JetStream across the leaf link
		// by the hub's domain.
		js, err = jetstream.NewWithDomain(nc, subjects.HubDomain, jetstream.WithPublishAsyncAckHandler(leaves.Published))
	} else {
		js, err = jetstream.New(nc, jetstream.WithPublishAsyncAckHandler(leaves.Published))
	}
	if err != nil {
		return nil, err
	}
	js = leaves.Wrap(js)
	opts := kvstore.Options{Replicas: topo.Replicas, Storage: topo.Storage, InvocationTTL: topo.InvocationTTL, Memory: mem,
		CheckpointRetention: topo.CheckpointRetention, Clock: topo.CheckpointClock}
	rights, bound := busauth.Rights[role]
	if role == busauth.RoleExecute && topo.Site != "" {
		rights = busauth.SiteRights(topo.Site)
	}
	// Refusals are audited through the node's JetStream: on an
	// authenticated bus only once it signs, and sends through audit
	// (SignAs), so what the first watches refuse waits for that.
	var self atomic.Pointer[Node]
	pub := func() jetstream.JetStream {
		if n := self.Load(); n != nil {
			return n.refusalJS()
		}
		if !bound {
			return js
		}
		return nil
	}
	if proof != nil {
		source := "urn:toolgate:" + cmp.Or(string(role), "operator")
		opts.CheckTool = checkTools(pub, source, proof, log)
		opts.CheckModel = checkModels(pub, source, proof, log)
		opts.CheckRevocation = checkRevocations(pub, source, proof, log)
	}
	if bound {
		opts.Bind, opts.Buckets = true, rights.Buckets()
	}
	if bound {
		// Credentials of another role are refused by the server without
		// an answer: say so at once instead of waiting for a topology.
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := topology.Bind(pctx, js, rights.Consumes)
		cancel()
		if le := nc.LastError(); err != nil && errors.Is(le, nats.ErrPermissionViolation) {
			return nil, fmt.Errorf("these credentials may not do the %s role's work (are they another role's?): %w", role, le)
		}
	}
	var store *kvstore.Store
	topo.Log = log
	what := "waiting for the NATS topology"
	if bound {
		what = "waiting for the operator's NATS topology (serve, or toolgate setup)"
	}
	err = topology.Retry(ctx, log, what, func(ctx context.Context) error {
		setup, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if bound {
			if err := topology.Bind(setup, js, rights.Consumes); err != nil {
				return err
			}
		} else if err := topology.EnsureTopology(setup, js, topo); err != nil {
			return err
		}
		var err error
		store, err = kvstore.Open(setup, js, opts)
		return err
	})
	if err != nil {
		return nil, err
	}
	n := &Node{NC: nc, JS: js, Store: store, Registry: tools.NewRegistry(), Revoked: new(token.Revocations), Topology: topo, Log: log, Role: role,
		leaves: leaves}
	if !bound {
		n.refusals.Store(&jsBox{js})
	}
	self.Store(n)
	watches := func(b string) bool { return !bound || slices.Contains(rights.Watches, b) }
	if watches(subjects.BucketTools) {
		if err := store.WatchTools(ctx, n.Registry, log); err != nil {
			return nil, err
		}
	}
	if watches(subjects.BucketRevocations) {
		ignored := func(jti string, rev uint64) {
			log.Warn("a revocation was removed before its token expired; the token stays revoked", "jti", jti, "revision", rev)
		}
		if proof != nil {
			source := "urn:toolgate:" + cmp.Or(string(role), "operator")
			ignored = func(jti string, rev uint64) {
				refusedState(ctx, pub, log, source, "revocation", rev,
					fmt.Errorf("token %s: a revocation is removed only by its token's expiry, not by a delete", jti))
			}
		}
		if err := store.WatchRevocations(ctx, n.Revoked.Set, ignored); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// jsBox holds a JetStream for an atomic pointer.
type jsBox struct{ jetstream.JetStream }

// Close closes the connection.
func (n *Node) Close() {
	n.closing.Store(true)
	n.NC.Close()
}

// onStop registers a closer for StopStages.
func (n *Node) onStop(f func()) {
	n.stopMu.Lock()
	defer n.stopMu.Unlock()
	n.stops = append(n.stops, f)
}

// StopStages closes what NewStage opened for the stages (MCP server
// processes, HTTP connections, the cancel subscription), last opened first,
// and returns when they are closed. Call it after the stages' runners have
// drained: in-flight calls still use these resources.
func (n *Node) StopStages() {
	n.stopMu.Lock()
	stops := n.stops
	n.stops = nil
	n.stopMu.Unlock()
	for _, f := range slices.Backward(stops) {
		f()
	}
}

// RegisterExamples stores the example tools shipped in the binary that the
// registry lacks, and waits until this node's registry holds them. A version
// already stored (by an earlier start, or as the operator changed or removed
// it since) is kept as it is: a restart undoes nothing the operator did.
func (n *Node) RegisterExamples(ctx context.Context) error {
	return n.registerExamples(ctx, nil)
}

// registerExamples is RegisterExamples; with sign (an operator's, on an
// authenticated bus) each record keeps the operator's signed register
// request, as if the operator had registered it, so readers of signed
// state honour it.
func (n *Node) registerExamples(ctx context.Context, sign *exampleSigner) error {
	ms, err := tools.Examples()
	if err != nil {
		return err
	}
	for _, m := range ms {
		doc, err := json.Marshal(m)
		if err != nil {
			return err
		}
		var proof *api.DecisionProof
		by := ""
		if sign != nil {
			body, err := json.Marshal(api.RegisterRequest{Manifest: doc})
			if err != nil {
				return err
			}
			h, err := sign.signer.Sign(nil, subjects.SvcToolsRegister, body, time.Now())
			if err != nil {
				return err
			}
			proof = &api.DecisionProof{Subject: subjects.SvcToolsRegister, Headers: h, Body: body}
			if by, err = sign.verify(proof); err != nil {
				return fmt.Errorf("signing example %s: %w", m.Key(), err)
			}
		}
		if _, err := n.Store.RegisterSignedTool(ctx, doc, false, by, proof); err != nil && api.AsError(err).ECode != api.EDuplicateTool {
			return fmt.Errorf("registering example %s: %w", m.Key(), err)
		}
	}
	for _, m := range ms {
		if err := n.WaitForTool(ctx, m.ID, m.Version); err != nil {
			return err
		}
	}
	return nil
}

// exampleSigner signs the example tools' records with operator
// credentials (busauth.Signer) and names the operator as readers will.
type exampleSigner struct {
	signer *busauth.Signer
	verify signedstate.Verify
}

// WaitForTool waits until the registry of this node has id at version.
func (n *Node) WaitForTool(ctx context.Context, id, version string) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if _, err := n.Registry.Resolve(id, version); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for tool %s@%s: %w", id, version, ctx.Err())
		case <-t.C:
		}
	}
}

// DefaultMCPInstallDir is where MCP servers are installed unless the
// operator lists other directories for their read_only_paths
// (sandbox.Config.ReadOnlyRoots, --mcp-path-roots).
const DefaultMCPInstallDir = "/opt/mcp"

// DefaultMicroCheckpointInterval is how often serve stores a running tool's
// reported state by default (seed 002 §1.4: micro checkpoints every 30 s).
const DefaultMicroCheckpointInterval = 30 * time.Second

// StageConfig holds what the stages need beyond the node.
type StageConfig struct {
	MaxEventBytes int
	// SiteWait bounds how long route lets a call wait at the hub for its
	// site (docs/sites.md); default DefaultSiteWait.
	SiteWait time.Duration
	// SiteDeclared, when set, reports whether a site is declared: route
	// ends a call for a removed site's tool (E3273).
	SiteDeclared func(site string) bool
	// HopsSince, when set, is when this process re-drove the calls whose
	// hops a restart of the server lost (topology.MemoryHops): audit
	// publishes an ending recorded before it again from its record
	// (audit.Auditor.RecoverEndings).
	HopsSince time.Time
	// Policy is used while the policy bucket holds no pushed bundle; nil
	// is the shipped default policy.
	Policy *policy.Engine
	// Tokens verifies capability tokens; authorize refuses every call
	// without it.
	Tokens *token.Verifier
	// ApprovalTimeout is how long a call waits for a human.
	ApprovalTimeout time.Duration
	// Sandbox runs cli tools; FileRoot defaults to BuiltinEnv.FileRoot.
	Sandbox sandbox.Config
	// MicroCheckpointInterval spaces the micro checkpoints of tools that
	// set no interval of their own; zero writes every state a tool reports
	// (serve's default is DefaultMicroCheckpointInterval).
	MicroCheckpointInterval time.Duration
	// RateLimits override tools' rate limits per tenant: tenant → tool id.
	RateLimits map[string]map[string]tools.RateLimit
	// Defaults replace the specification's defaults (tools.SeedDefaults)
	// member by member where a manifest is silent; TenantDefaults replace
	// them per tenant, but for the breaker, which tenants share.
	Defaults       tools.Defaults
	TenantDefaults map[string]tools.Defaults
	// RateLimitLease caps the tokens a route worker leases at once;
	// default ratelimit.DefaultMaxLease.
	RateLimitLease int
	Builtins       builtin.Set // nil: builtin.New(BuiltinEnv)
	BuiltinEnv     builtin.Env
	// TenantActions tighten the output policy per tenant (verify.Config.Tenants).
	TenantActions map[string]map[string]string
	// Detectors replaces the shipped detector rules when set.
	Detectors *detect.Engine
	// InjectionClassifier, when set, judges the results and error texts
	// the prompt_injection rules pass (verify.Config.Classifier).
	InjectionClassifier verify.Classifier
	// Secrets supplies the credentials http tools inject; nil reads
	// SecretsDir, then TOOLGATE_SECRET_<NAME> environment variables.
	Secrets httptool.Secrets
	// SecretsDir holds one file per secret (--secrets-dir).
	SecretsDir string
	// HTTPAllowPrivateNetworks lets http tools reach loopback and private
	// addresses through granted host names (httptool.Config).
	HTTPAllowPrivateNetworks bool
	// Concurrency is the calls execute shares between tenants in this
	// process (execute.TenantQuota's Capacity); 0 turns the tenant quota off.
	Concurrency int
	// TenantInFlight caps one tenant's share of Concurrency while other
	// tenants run calls; 0 is an equal share.
	TenantInFlight int
	// MCP tunes the supervision of MCP servers; their sandbox is the one
	// cli tools get.
	MCP mcptool.Config
	// Kinds are the tool kinds route sends on, authorize accounts for and
	// execute runs; nil is those compiled in (kinds.Compiled).
	Kinds *kind.Registry
	// ModelStats, when set, records model calls (Prometheus).
	ModelStats *modeltool.Stats
	// ModelStatsFlush is how often execute writes its share of the
	// cluster-wide model statistics to KV; default 2 s.
	ModelStatsFlush time.Duration
	// Sealer signs authorize's decisions (Run loads the deployment's
	// hop-sealing key); nil hands calls on unsealed.
	Sealer *seal.Sealer
	// Messages checks who signed a record another role stored for this
	// one (a hook's decision, by audit); Run sets it on an authenticated
	// bus, where every role signs what it publishes.
	Messages *seal.Messages
	// TokenSeal seals capability tokens in validate and opens them in
	// authorize; nil (only on a bus without authentication) hands raw
	// tokens on.
	TokenSeal *seal.Tokens
	// Seals checks those seals in execute; nil runs unsealed calls too
	// (only on a bus without authentication: Run refuses to start execute
	// on an authenticated bus without the key).
	Seals *seal.Verifier
	// PrincipalSeals checks, in audit, the seal that covers the principal
	// of a call authorize admitted, before a hook starts a child as it
	// (Run loads seal.pub for audit); nil: the Sealer's or Seals when this
	// process holds them.
	PrincipalSeals *seal.Verifier
	// ApprovalProof verifies approvals in authorize (Run sets it on an
	// authenticated bus: an operator's signature of this deployment).
	ApprovalProof func(a kvstore.Approval, requestDigest string) error
	// StateProof verifies operators' signatures on signed state (a pushed
	// policy); Run sets it on an authenticated bus. Nil honours unsigned
	// state (a bus without authentication).
	StateProof signedstate.Verify
	// ShadowMetrics counts the calls on which the candidate policy
	// diverged (Run sets it on its metrics registry); nil counts nothing.
	ShadowMetrics *ShadowMetrics
	// RecordDecisions has authorize audit each call's policy input,
	// redacted, and its decision, for `toolgate policy replay`.
	RecordDecisions bool
	// AuditChainKey signs the checkpoints over AUDIT that audit writes
	// (Run loads busauth.AuditChainKeyFile); nil writes none.
	AuditChainKey ed25519.PrivateKey
	// AuditCheckpointEvery and AuditCheckpointInterval bound how many
	// events and how long a checkpoint waits for (auditchain's defaults).
	AuditCheckpointEvery    int
	AuditCheckpointInterval time.Duration
	// AuditChainMetrics counts the events checkpoints cover, by where
	// their leaves came from (Run sets it on its metrics registry); nil
	// counts nothing.
	AuditChainMetrics *AuditChainMetrics
	// AuditArchive is where audit archives closed ranges of AUDIT
	// (archivestore.Open: "" is the bus's default bucket), every
	// AuditArchiveEvery (0: never); AuditArchiveMetrics counts them.
	AuditArchive        string
	AuditArchiveEvery   time.Duration
	AuditArchiveMetrics *AuditArchiveMetrics
	// AuditOTLP is the OTLP/HTTP collector audit sends AUDIT's events to
	// as log records ("": none); AuditOTLPMetrics counts them.
	AuditOTLP        string
	AuditOTLPMetrics *AuditOTLPMetrics
}

// kinds are the tool kinds the stages run: Kinds, or those compiled in.
func (c StageConfig) kinds() *kind.Registry {
	if c.Kinds != nil {
		return c.Kinds
	}
	return kinds.Compiled()
}

// toolSandbox is the sandbox cli tools and stdio MCP servers run in, and
// why it cannot run here (nil when it can).
func (n *Node) toolSandbox(c StageConfig) (sandbox.Config, error) {
	sb := c.Sandbox
	sb.FileRoot = cmp.Or(sb.FileRoot, c.BuiltinEnv.FileRoot)
	if len(sb.ReadOnlyRoots) == 0 {
		sb.ReadOnlyRoots = []string{DefaultMCPInstallDir}
		if sb.FileRoot != "" {
			sb.ReadOnlyRoots = append(sb.ReadOnlyRoots, sb.FileRoot)
		}
	}
	if sb.Mode == sandbox.ModeNone {
		n.Log.Warn("cli tools run without a sandbox (--sandbox none): limits apply, isolation does not")
		if sb.CPU == nil && sb.CPUErr == nil {
			sb.CPU, sb.CPUErr = cpuCgroup(n.Log)
		}
		return sb, nil
	}
	if sb.CPU == nil && sb.CPUErr == nil { // a configured CPUErr forces none
		sb.CPU, sb.CPUErr = cpuCgroup(n.Log)
	}
	err := sandbox.Available()
	if err != nil {
		n.Log.Warn("cli tools will be refused", "err", err)
	}
	return sb, err
}

// cpuDetect finds the cgroup for CPU shares once per process, so that
// serve says once at start whether they apply.
var cpuDetect struct {
	once sync.Once
	cg   *sandbox.CPUCgroup
	err  error
}

// cpuCgroup is where runs' CPU shares are applied, or why they are not.
func cpuCgroup(log *slog.Logger) (*sandbox.CPUCgroup, error) {
	cpuDetect.once.Do(func() {
		cpuDetect.cg, cpuDetect.err = sandbox.DetectCPU()
		if cpuDetect.err != nil {
			log.Warn("CPU shares (limits.cpu_millicores, resource_limits.cpu_millicore_limit) are not applied; calls asking for one get warning "+api.ECPUShareNotApplied, "why", cpuDetect.err)
			return
		}
		log.Info("CPU shares are applied through a cgroup per run", "dir", cpuDetect.cg.Dir, "cgroup_v2", cpuDetect.cg.V2)
	})
	return cpuDetect.cg, cpuDetect.err
}

// settings are the defaults of each tenant's calls.
func (c StageConfig) settings() *tools.Settings {
	return &tools.Settings{Base: c.Defaults, Tenants: c.TenantDefaults}
}

// NewStage builds the logic of the named stage. ctx bounds its watches;
// the resources it opens live until StopStages.
func (n *Node) NewStage(ctx context.Context, name string, c StageConfig) (stages.Stage, error) {
	switch name {
	case subjects.Validate:
		vc := validate.Config{MaxEventBytes: c.MaxEventBytes, Detectors: c.Detectors, Claims: n.Store}
		if c.TokenSeal != nil {
			vc.Tokens = c.TokenSeal
		}
		return validate.New(n.Registry, vc), nil
	case subjects.Authorize:
		return n.newAuthorizer(ctx, c)
	case subjects.Route:
		r := route.New(n.Registry, c.kinds().Names()...)
		r.SiteWait = cmp.Or(c.SiteWait, DefaultSiteWait)
		r.SiteDeclared = c.SiteDeclared
		n.Store.OnCounterErased(func(ctx context.Context, tenant, tool string) {
			n.refusedState(ctx, "urn:toolgate:route", "ratelimit:"+tenant+"/"+tool, 0, api.NewError(api.RateLimitExceeded,
				api.ECounterErased, "the rate-limit counter of %s in tenant %s was deleted: counted as empty from then, not refilled", tool, tenant))
		})
		limits := ratelimit.New(n.Store, cmp.Or(c.RateLimitLease, ratelimit.DefaultMaxLease))
		limits.Overrides = c.RateLimits
		limits.Defaults = c.settings().For
		r.Limits = limits
		return r, nil
	case subjects.Execute:
		set := c.Builtins
		if set == nil {
			set = builtin.New(c.BuiltinEnv)
		}
		running := execute.NewRunning()
		sub, err := n.NC.Subscribe(subjects.CancelAll, func(m *nats.Msg) {
			if c.Messages != nil {
				if _, err := c.Messages.Sender(m.Subject, m.Header, m.Data); err != nil {
					n.Log.Warn("ignoring a cancel control did not sign", "subject", m.Subject, "err", err)
					return
				}
			}
			if tenant, id, ok := subjects.ParseCancel(m.Subject); ok {
				running.Cancel(tenant, id)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("subscribing to cancels: %w", err)
		}
		n.onStop(func() { _ = sub.Unsubscribe() })
		x := execute.New(n.Registry, set, n.Store, running)
		// What the executor is given beyond New, in one place; its kinds
		// follow, each with what it holds.
		x.Publish = func(ctx context.Context, o stages.Output) error { return runner.Publish(ctx, n.JS, o) }
		if c.Concurrency > 0 {
			x.Quota = execute.NewTenantQuota(c.Concurrency, c.TenantInFlight)
		}
		x.MicroInterval = c.MicroCheckpointInterval
		x.Defaults, x.AgentRuns = c.settings().For, n.Store
		if c.Seals != nil { // a nil *seal.Verifier would be a non-nil Seals
			x.Seals = c.Seals
		}
		if c.Messages != nil {
			x.CancelSigned = c.Messages.CancelSigned
			if n.Signer != nil {
				n.Store.SignCheckpoints(n.Signer.SignCheckpoint, c.Messages.CheckpointSigned)
			}
		}
		x.Refused = func(ctx context.Context, what string, rev uint64, cause error) {
			n.refusedState(ctx, "urn:toolgate:execute", what, rev, cause)
		}
		x.Verifier = verify.New(n.Registry, verify.Config{Tenants: c.TenantActions, Detectors: c.Detectors, Classifier: c.InjectionClassifier})
		x.Breakers = breaker.New(n.Store, x.Publish, n.Log)
		if n.Topology.Site != "" {
			x.SiteScrub = cmp.Or(c.Detectors, detect.Default())
		}
		sb, sbErr := n.toolSandbox(c)
		secretSource := c.Secrets
		if secretSource == nil {
			secretSource = &secrets.Source{Dir: c.SecretsDir}
		}
		mc := c.MCP
		mc.Sandbox, mc.SandboxErr, mc.Log = sb, sbErr, cmp.Or(mc.Log, n.Log)
		docs, err := n.newDocuments(ctx, c, mc)
		if err != nil {
			return nil, err
		}
		x.Documents = docs
		n.onStop(x.Breakers.Close)
		models := modelrouter.NewCatalogue()
		if err := n.Store.WatchModels(ctx, models); err != nil {
			return nil, err
		}
		observed, err := n.Store.WatchModelStats(ctx)
		if err != nil {
			return nil, err
		}
		// The recorder writes this process's shards in the background; its
		// last flush runs when the stages stop, after in-flight calls end.
		rec := n.Store.NewModelStatsRecorder()
		flushCtx, stopFlush := context.WithCancel(ctx)
		flushed := make(chan struct{})
		go func() {
			defer close(flushed)
			rec.Run(flushCtx, cmp.Or(c.ModelStatsFlush, 2*time.Second), func(err error) {
				n.Log.Warn("model statistics not written; retrying", "err", err)
			})
		}()
		n.onStop(func() { stopFlush(); <-flushed })
		// The kinds are built from the one list route and authorize have
		// too; each takes what it needs from the deps.
		deps := &kind.Deps{Log: n.Log, Sandbox: sb, SandboxErr: sbErr, Secrets: secretSource,
			AllowPrivateNetworks: c.HTTPAllowPrivateNetworks, Breakers: x.Breakers, OnStop: n.onStop,
			Settings: []any{mc, modeltool.Config{Catalogue: models, Stats: c.ModelStats, Recorder: rec, Observer: observed.Observer}}}
		if err := x.Install(c.kinds(), deps); err != nil {
			return nil, err
		}
		apply := x.Breakers.Apply
		if c.StateProof != nil {
			apply = func(st kvstore.BreakerState) {
				if err := checkBreaker(st, x.Breakers, c.StateProof); err != nil {
					n.refusedState(ctx, "urn:toolgate:execute", "breaker", st.Revision, fmt.Errorf("breaker %s: %w", st.Key, err))
					return
				}
				x.Breakers.Apply(st)
			}
		}
		if err := n.Store.WatchBreakers(ctx, apply); err != nil {
			return nil, err
		}
		return x, nil
	case subjects.Verify:
		return verify.New(n.Registry, verify.Config{Tenants: c.TenantActions, Detectors: c.Detectors, Classifier: c.InjectionClassifier}), nil
	case subjects.Audit:
		tenants := new(hooks.Tenants)
		var order signedstate.Order
		err := n.Store.WatchHooks(ctx, func(tenant string, set *kvstore.HookSet) {
			if set == nil {
				order.Removed(tenant)
				tenants.Put(tenant, nil)
				return
			}
			if c.StateProof != nil {
				if err := order.Hooks(*set, c.StateProof); err != nil {
					n.refusedState(ctx, "urn:toolgate:audit", "hooks", set.Revision, err)
					return
				}
			}
			compiled, err := hooks.Parse(set.Doc, hooks.SourceTenant)
			if err != nil {
				// Push compiles first, so this needs a hand-edited bucket.
				n.Log.Error("pushed hooks do not compile; keeping the current ones", "tenant", tenant, "revision", set.Revision, "err", err)
				return
			}
			tenants.Put(tenant, compiled)
		})
		if err != nil {
			return nil, err
		}
		if c.AuditChainKey != nil {
			// Checkpoints are made beside the stage; the leaves of what
			// this connection publishes are hashed as it is acknowledged,
			// so the checkpointer reads back only what others published.
			cp := &auditchain.Checkpointer{JS: n.JS, Key: c.AuditChainKey, Every: c.AuditCheckpointEvery,
				Interval: c.AuditCheckpointInterval, Log: n.Log, Leaves: n.leaves, Counted: c.AuditChainMetrics.counted}
			if n.Signer != nil {
				// On an authenticated bus only audit writes audit events:
				// each carries a MAC under the chain key, which every
				// audit process holds, so the checkpoints can name the
				// events no audit process wrote. (SignAs made n.JS
				// before; the runner and refusals publish through it.)
				cp.Events = auditchain.NewEventKey(c.AuditChainKey)
				n.JS = auditchain.Authenticating(n.JS, cp.Events, n.leaves)
				n.refusals.Store(&jsBox{n.JS})
			}
			cctx, stop := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); cp.Run(cctx) }()
			n.onStop(func() { stop(); <-done })
			if err := n.startArchive(ctx, c); err != nil {
				return nil, err
			}
		}
		if err := n.startAuditOTLP(ctx, c); err != nil {
			return nil, err
		}
		h := &audit.Hooks{Registry: n.Registry, Tenants: tenants}
		if n.Signer != nil && c.Messages != nil {
			h.SignDecision = func(text []byte) string { return n.Signer.SignRecord(recordDecision, text) }
			h.DecisionSigned = func(text []byte, sig string) bool {
				return c.Messages.Record(busauth.RoleAudit, recordDecision, text, sig)
			}
			h.PrincipalSigned = func(text []byte, sig string) bool {
				return c.Messages.Record(busauth.RoleAuthorize, recordPrincipal, text, sig)
			}
			if v := c.principalSeals(); v != nil {
				h.PrincipalSealed = v.Principal
			}
		}
		a := audit.New(n.Store, h)
		if !c.HopsSince.IsZero() {
			a.RecoverEndings(c.HopsSince, cmp.Or(n.Topology.Duplicates, topology.DefaultDuplicates), n.hasResult)
		}
		if c.AuditChainKey != nil {
			// Receipts are signed with the chain key: audit-chain.pub,
			// which verifiers hold for the checkpoints, checks them too.
			a.SignReceipts(auditchain.NewReceiptSigner(c.AuditChainKey))
		}
		// The statistics recorded since the last write go out when the
		// stages stop, after in-flight calls end.
		n.onStop(func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := a.FlushStats(ctx); err != nil {
				n.Log.Warn("tool statistics not written", "err", err)
			}
		})
		return a, nil
	}
	return nil, fmt.Errorf("unknown stage %q (stages: %v)", name, subjects.Stages)
}

// SignAs gives the connection its role's message-signing key from
// dataDir/busauth, so that what it publishes is signed, and has its stages
// check who sent what they read; Run does it for every role it connects.
func (n *Node) SignAs(dataDir string) error {
	pubs, err := busauth.LoadHopPublicKeys(dataDir)
	if err != nil {
		return err
	}
	msgs := seal.NewMessages(pubs)
	trustReceipts(msgs, nil, dataDir)
	return n.signAs(dataDir, n.Role, msgs, n.Role != busauth.RoleValidate, false)
}

// trustReceipts has msgs check the results audit seals with their receipts
// (seal.HeaderSeal) with the chain key's public half: of key when this
// process holds the key, else audit-chain.pub in dataDir. Without either,
// a sealed result is refused.
func trustReceipts(msgs *seal.Messages, key ed25519.PrivateKey, dataDir string) {
	if key != nil {
		msgs.TrustReceipts(key.Public().(ed25519.PublicKey))
	} else if pub, err := busauth.LoadAuditChainPublicKey(dataDir); err == nil && dataDir != "" {
		msgs.TrustReceipts(pub)
	}
}

// signAs signs what the node publishes with r's key, but for a chained
// audit (its checkpoints sign the trail) the audit events themselves.
func (n *Node) signAs(dataDir string, r busauth.Role, msgs *seal.Messages, check, chained bool) error {
	k, err := busauth.LoadHopKey(dataDir, r)
	if err != nil {
		return fmt.Errorf("%s needs its message-signing key (%s in %s): %w", r, busauth.HopKeyFile(r),
			filepath.Join(dataDir, busauth.DirName), err)
	}
	n.Signer = msgs.NewSigner(r, k)
	var except func(string) bool
	if chained && r == busauth.RoleAudit {
		except = subjects.IsAudit
	}
	n.JS = seal.SigningJetStreamExcept(n.JS, n.Signer, except)
	if r != busauth.RoleAudit {
		n.JS = runner.Relaying(n.JS)
	}
	n.refusals.Store(&jsBox{n.JS})
	if check {
		n.Senders = func(subject string, h nats.Header, data []byte) (bool, error) {
			_, ours, err := msgs.Check(subject, h, data)
			return ours, err
		}
		switch r {
		case busauth.RoleAudit:
			n.Endings = msgs.Ending
		case busauth.RoleVerify:
			n.Endings = msgs.HandOff
		}
	}
	return nil
}

// checkBreaker judges a breaker's shared state before execute honours it:
// a forced state must be an operator's signed breakers.set, no older than
// the forced state held; a state that ends a forced one must be the
// operator's signed release, signed after it; and no state may date from
// the future (an open breaker "since" next year would never reopen).
// Execute workers write the bucket too, but never over a forced state.
func checkBreaker(st kvstore.BreakerState, b *breaker.Breakers, proof signedstate.Verify) error {
	held, ok := b.Held(st.Key)
	heldForced := ok && held.Forced
	switch {
	case st.Forced || heldForced:
		if st.Proof == nil {
			return signedstate.ErrUnsigned
		}
		at, err := signedstate.Breaker(st, proof)
		if err != nil {
			return err
		}
		if heldForced && !at.After(signedstate.SignedAt(held.Proof)) && !(st.Forced && at.Equal(signedstate.SignedAt(held.Proof))) {
			return errors.New("an operator's request older than the forced state in force")
		}
	case st.Since.After(time.Now().Add(time.Minute)):
		return fmt.Errorf("a state since %s, in the future", st.Since.Format(time.RFC3339))
	}
	return nil
}

// The kinds of record one role signs for another: authorize the principal
// it verified, audit the decisions of hooks.

// principalSeals is what checks the seal that covers an admitted call's
// principal here (StageConfig.PrincipalSeals), or nil.
func (c *StageConfig) principalSeals() *seal.Verifier {
	switch {
	case c.PrincipalSeals != nil:
		return c.PrincipalSeals
	case c.Sealer != nil:
		return c.Sealer.Verifier()
	}
	return c.Seals
}

const (
	recordPrincipal = "principal"
	recordDecision  = "hook-decision"
)

// newAuthorizer builds the authorize stage and keeps its policy in step with
// the policy bucket: a pushed bundle replaces the configured policy, a
// deleted one restores it, and one that does not compile is logged and
// ignored (push compiles first, so that needs a hand-edited bucket).
func (n *Node) newAuthorizer(ctx context.Context, c StageConfig) (*authorize.Authorizer, error) {
	fallback := c.Policy
	if fallback == nil {
		var err error
		if fallback, err = policy.Default(ctx); err != nil {
			return nil, err
		}
	}
	verifier := c.Tokens
	if verifier == nil {
		verifier = &token.Verifier{Keys: token.StaticKeys{}} // refuses every token
		n.Log.Warn("no capability token key set configured: every invocation will be refused")
	}
	aborts, err := n.Store.WatchAborts(ctx)
	if err != nil {
		return nil, err
	}
	ac := authorize.Config{
		Registry: n.Registry, Kinds: c.kinds(), Policy: fallback, Verifier: verifier, Revoked: n.Revoked,
		Store: n.Store, Decisions: n.Store, ApprovalTimeout: c.ApprovalTimeout, Aborted: aborts,
	}
	if c.TokenSeal != nil {
		ac.TokenSeal = c.TokenSeal
	}
	if n.Signer != nil && c.Messages != nil {
		ac.SignPrincipal = func(text []byte) string { return n.Signer.SignRecord(recordPrincipal, text) }
		ac.Custody = func(tenant, id string, seq uint64) string {
			return n.Signer.Custody(busauth.RoleControl, tenant, id, seq)
		}
		ac.DecisionSigned = func(text []byte, sig string) bool {
			return c.Messages.Record(busauth.RoleAudit, recordDecision, text, sig)
		}
		ac.PrincipalSigned = func(text []byte, sig string) bool {
			return c.Messages.Record(busauth.RoleAuthorize, recordPrincipal, text, sig)
		}
		if v := c.principalSeals(); v != nil {
			ac.PrincipalSealed = v.Principal
		}
	}
	if c.StateProof != nil {
		ac.RedriveProof = c.StateProof // an operator's signed redrive.run
	}
	ac.OnShadowDiverged = c.ShadowMetrics.observe
	ac.RecordDecisions = c.RecordDecisions
	a := authorize.New(ac)
	if c.Sealer != nil {
		a.SetSealer(c.Sealer)
	}
	if c.ApprovalProof != nil {
		a.SetApprovalProof(c.ApprovalProof)
	}
	var order signedstate.Order
	err = n.Store.WatchPolicy(ctx, func(b kvstore.PolicyBundle, ok bool, err error) {
		if !ok {
			order.Removed("policy")
		}
		if ok && err == nil && c.StateProof != nil {
			if err := order.Policy(b, c.StateProof); err != nil {
				n.refusedState(ctx, "urn:toolgate:authorize", "policy", b.Revision, err)
				return
			}
		}
		if !ok {
			a.SetPolicy(fallback)
			n.Log.Info("policy bundle removed; using the configured policy")
			return
		}
		var e *policy.Engine
		if err == nil {
			e, err = policy.New(ctx, b.Modules, b.Data)
		}
		if err != nil {
			n.Log.Error("pushed policy does not load; keeping the current one", "revision", b.Revision, "err", err)
			return
		}
		e.Revision = b.Revision
		a.SetPolicy(e)
		n.Log.Info("policy loaded", "revision", b.Revision, "modules", len(b.Modules))
	})
	if err != nil {
		return nil, err
	}
	if err := n.watchShadow(ctx, a, c); err != nil {
		return nil, err
	}
	return a, nil
}

// refusedState logs and audits a record a stage ignored.
func (n *Node) refusedState(ctx context.Context, source, what string, rev uint64, cause error) {
	refusedState(ctx, n.refusalJS, n.Log, source, what, rev, cause)
}

// refusalJS is the JetStream refusals are audited through, nil until the
// connection of a role signs.
func (n *Node) refusalJS() jetstream.JetStream {
	if b := n.refusals.Load(); b != nil {
		return b.JetStream
	}
	return nil
}

// refusedState logs a record a reader ignored and audits it through js,
// at once or, when js has none yet, as soon as it has.
func refusedState(ctx context.Context, js func() jetstream.JetStream, log *slog.Logger, source, what string, rev uint64, cause error) {
	log.Error("ignoring unsigned state: no operator's signature covers it", "what", what, "revision", rev, "err", cause)
	o, err := signedstate.RefusedEvent(source, what, rev, cause)
	if err != nil {
		log.Error("auditing ignored state", "what", what, "revision", rev, "err", err)
		return
	}
	publish := func(j jetstream.JetStream) {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := runner.Publish(pctx, j, o); err != nil {
			log.Error("auditing ignored state", "what", what, "revision", rev, "err", err)
		}
	}
	if j := js(); j != nil {
		publish(j)
		return
	}
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		giveUp := time.After(time.Minute)
		for {
			select {
			case <-tick.C:
				if j := js(); j != nil {
					publish(j)
					return
				}
			case <-giveUp:
				log.Error("auditing ignored state: the connection never got its signing key", "what", what, "revision", rev)
				return
			case <-ctx.Done():
				return
			}
		}
	}()
}

// checkModels makes the model catalogue and routing policy honour only
// records an operator signed; one that fails is ignored (what is in use
// stays) and audited by source.
func checkModels(js func() jetstream.JetStream, source string, proof signedstate.Verify, log *slog.Logger) kvstore.CheckModel {
	var order signedstate.Order
	return func(rec kvstore.ModelRecord, key string, rev uint64) error {
		err := order.Model(rec, key, proof)
		if err != nil {
			what := "model"
			if key == modelrouter.RoutingKey {
				what = "routing_policy"
			}
			refusedState(context.Background(), js, log, source, what, rev, fmt.Errorf("%s: %w", key, err))
		}
		return err
	}
}

// checkTools makes a registry honour only tool manifests an operator
// signed; one that fails is ignored (the registry keeps what it had for
// the key) and audited by source.
func checkTools(js func() jetstream.JetStream, source string, proof signedstate.Verify, log *slog.Logger) kvstore.CheckTool {
	var order signedstate.Order
	return func(rec kvstore.ToolRecord, key string, rev uint64) error {
		err := order.Tool(rec, key, proof)
		if err != nil {
			refusedState(context.Background(), js, log, source, "tool", rev, fmt.Errorf("tool %s: %w", key, err))
		}
		return err
	}
}

// checkRevocations judges revocation records for a reader of signed state:
// only an operator's signed revoke request revokes a token, so the control
// role's right to write the bucket cannot revoke an agent by itself. What
// it ignores is audited.
func checkRevocations(js func() jetstream.JetStream, source string, proof signedstate.Verify, log *slog.Logger) kvstore.CheckRevocation {
	return func(rec kvstore.Revocation, jti string, rev uint64) error {
		err := signedstate.Revocation(rec, jti, proof)
		if err != nil {
			refusedState(context.Background(), js, log, source, "revocation", rev, fmt.Errorf("token %s: %w", jti, err))
		}
		return err
	}
}

// Runner returns a Runner of stage st on this node.
func (n *Node) Runner(name string, st stages.Stage, workers int, m *runner.Metrics) *runner.Runner {
	r := &runner.Runner{Name: name, Stage: st, JS: n.JS, Workers: workers, Log: n.Log, Metrics: m, Records: n.Store, Senders: n.Senders,
		Endings: n.Endings}
	if n.Signer != nil && n.Senders != nil {
		r.Custody, r.EndingTag, r.SiteBinding = n.Signer.Custody, n.Signer.EndingTag, n.Signer.SiteBinding
	}
	if name == subjects.Execute {
		// Tools bound themselves (limits.timeout_ms is at most an hour).
		r.Timeout = time.Hour + time.Minute
	}
	return r
}

// executeSlots resolves the execute settings of c: the calls shared
// between tenants, each tenant's cap, and the Runner's workers (the
// capacity and, with the quota on, its headroom for tenants below their
// share).
func executeSlots(c *Config) (capacity, tenantCap, workers int) {
	capacity = cmp.Or(c.Workers, DefaultWorkers)
	if c.TenantInFlight < 0 {
		return 0, 0, capacity
	}
	return capacity, c.TenantInFlight, capacity + execute.Headroom(capacity)
}

// hasResult reports whether the results stream holds a message on subject:
// a direct get of the subject's last message, which the audit role may make
// of the results it publishes.
func (n *Node) hasResult(ctx context.Context, subject string) (bool, error) {
	body, err := json.Marshal(struct {
		LastBySubject string `json:"last_by_subj"`
	}{subject})
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := n.NC.RequestWithContext(ctx, subjects.DirectGet(subjects.StreamResults), body)
	if err != nil {
		return false, err
	}
	switch status := m.Header.Get("Status"); status {
	case "":
		return true, nil
	case "404":
		return false, nil
	default:
		return false, fmt.Errorf("direct get from %s: status %s %s", subjects.StreamResults, status, m.Header.Get("Description"))
	}
}
