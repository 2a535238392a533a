package mcptool

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/hosts"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages/execute"
	"github.com/toolgate/toolgate/stages/execute/kind"
)

// Config is how the execute stage runs MCP servers.
type Config struct {
	// Sandbox runs stdio servers, as it runs cli tools.
	Sandbox sandbox.Config
	// SandboxErr, when set, says why stdio servers cannot be sandboxed
	// here; they are refused (streamable-HTTP servers still run).
	SandboxErr error
	// Backoff bounds restarts of a crashed server; default 200 ms to 30 s.
	Backoff Backoff
	// StartTimeout bounds a server's start and handshake; default 30 s.
	StartTimeout time.Duration
	Log          *slog.Logger
}

// Server processes get more address space and processes than one-shot
// tools: a Node.js server reserves about 1 GiB of address space before it
// does anything, and its threads count against the process limit.
const (
	DefaultMemoryMB = 2048
	DefaultPIDs     = 256
)

// Kind runs mcp tools; it implements execute.Kind.
type Kind struct {
	cfg     Config
	mu      sync.Mutex
	servers map[string]*server
	closed  bool
}

var _ execute.Kind = (*Kind)(nil)

// New returns a Kind with no servers running; they start on first use.
func New(cfg Config) *Kind {
	cfg.Backoff.Min = cmp.Or(cfg.Backoff.Min, 200*time.Millisecond)
	cfg.Backoff.Max = cmp.Or(cfg.Backoff.Max, 30*time.Second)
	cfg.StartTimeout = cmp.Or(cfg.StartTimeout, 30*time.Second)
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Kind{cfg: cfg, servers: map[string]*server{}}
}

// Prepare implements execute.Kind.
func (k *Kind) Prepare(m *tools.Manifest, inv *envelope.Invocation) (kind.Func, error) {
	var grants envelope.Grants
	tenant := ""
	if inv != nil {
		tenant = inv.Tenant
		if inv.Authz != nil {
			grants = inv.Authz.Grants
		}
	}
	fn, _, err := k.prepare(m, tenant, grants)
	return fn, err
}

func (k *Kind) prepare(m *tools.Manifest, tenant string, grants envelope.Grants) (kind.Func, *server, error) {
	spec, err := Decode(m)
	if err != nil {
		return nil, nil, err
	}
	var key string
	var dial dialFunc
	if spec.URL != "" {
		host, port, err := allowedEndpoint(m, spec, grants)
		if err != nil {
			return nil, nil, err
		}
		key, err = identity(serverDef{Tenant: tenant, Name: spec.Server, URL: spec.URL, Concurrency: spec.MaxConcurrency})
		if err != nil {
			return nil, nil, err
		}
		dial = httpDial(spec.URL, host, port)
	} else {
		sp, err := k.processSpec(m, spec, grants)
		if err != nil {
			return nil, nil, err
		}
		def := serverDef{Tenant: tenant, Name: spec.Server, Argv: sp.Argv, Env: sp.Env, Mounts: sp.Mounts,
			Network: sp.Network, Limits: sp.Limits, Concurrency: spec.MaxConcurrency}
		if sp.Network {
			// The egress proxy admits the hosts of these grants only.
			def.Hosts, def.Ports = grants.Hosts, grants.Ports
		}
		key, err = identity(def)
		if err != nil {
			return nil, nil, err
		}
		dial = stdioDial(k.cfg.Sandbox, sp)
	}
	srv, err := k.server(key, spec, dial)
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
		if len(params) == 0 || string(params) == "null" {
			params = json.RawMessage(`{}`)
		}
		res, err := srv.call(ctx, spec.Tool, params)
		if err != nil {
			return nil, err
		}
		return Result(m, res)
	}, srv, nil
}

// processSpec is the sandbox run of a stdio server: the same confinement as
// a cli tool, plus the read-only paths the server needs.
func (k *Kind) processSpec(m *tools.Manifest, spec *Spec, grants envelope.Grants) (sandbox.Spec, error) {
	if k.cfg.SandboxErr != nil {
		return sandbox.Spec{}, api.NewError(api.SandboxFailure, api.EExecutorUnavailable,
			"stdio MCP servers are refused here: %v (an operator may choose --sandbox none, which does not isolate)", k.cfg.SandboxErr).
			WithDetail("not_started", true)
	}
	return k.cfg.Sandbox.Build(sandbox.Request{Manifest: m, Grants: grants, Argv: spec.Command, Env: spec.Env,
		Network: spec.Network, ReadOnlyPaths: spec.ReadOnlyPaths,
		Defaults: sandbox.Limits{MemoryMB: DefaultMemoryMB, PIDs: DefaultPIDs}})
}

// allowedEndpoint checks a server URL's host against the manifest's network
// permissions and the token's hosts (authorize checked the second already;
// checking here too keeps a policy mistake from reaching a server).
func allowedEndpoint(m *tools.Manifest, spec *Spec, grants envelope.Grants) (string, int, error) {
	host, port, err := endpoint(spec.URL)
	if err != nil {
		return "", 0, unusable(m, "%v", err)
	}
	if !tools.DeclaresEndpoint(m.Permissions.Network, host, port) {
		return "", 0, api.NewError(api.PermissionDenied, api.ENetworkDenied,
			"%s: the MCP server's host %s:%d is not in the manifest's network permissions", m.Key(), host, port).
			WithDetail("not_started", true)
	}
	granted := hosts.Any(grants.Hosts, host) &&
		(len(grants.Ports) == 0 || slices.Contains(grants.Ports, port))
	if !granted {
		return "", 0, api.NewError(api.PermissionDenied, api.ENetworkDenied,
			"%s: the capability token does not grant the MCP server's host %s:%d", m.Key(), host, port).
			WithDetail("not_started", true)
	}
	return host, port, nil
}

// serverDef is what a server process is keyed by: the tenant, so tenants
// never share a server's state, and every field of the definition that
// shapes the process (command, environment, mounts, network, limits), so a
// changed definition starts a new process. Only plain data: it must encode.
type serverDef struct {
	Tenant      string            `json:"tenant"`
	Name        string            `json:"name"`
	URL         string            `json:"url,omitempty"`
	Argv        []string          `json:"argv,omitempty"`
	Env         map[string]string `json:"env,omitempty"` // encoded with sorted keys
	Mounts      []sandbox.Mount   `json:"mounts,omitempty"`
	Network     bool              `json:"network,omitempty"`
	Hosts       []string          `json:"hosts,omitempty"`
	Ports       []int             `json:"ports,omitempty"`
	Limits      sandbox.Limits    `json:"limits"`
	Concurrency int               `json:"concurrency,omitempty"`
}

// identity is the key of def's server process: its name, for logs, and a
// hash of the whole definition.
func identity(def serverDef) (string, error) {
	b, err := json.Marshal(def)
	if err != nil {
		return "", api.WrapError(err, api.ToolExecutionError, api.EExecutorUnavailable,
			"MCP server %s: encoding its definition: %v", def.Name, err).WithDetail("not_started", true)
	}
	sum := sha256.Sum256(b)
	return def.Name + "/" + hex.EncodeToString(sum[:16]), nil
}

func (k *Kind) server(key string, spec *Spec, dial dialFunc) (*server, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil, api.NewError(api.ExternalAPIError, api.EMCPServerDown,
			"MCP server %s is not running: toolgate is shutting down", spec.Server).AsRetryable().WithDetail("not_started", true)
	}
	s, ok := k.servers[key]
	if !ok {
		s = newServer(spec.Server, dial, cmp.Or(spec.MaxConcurrency, DefaultConcurrency), k.cfg.Backoff,
			k.cfg.StartTimeout, k.cfg.Log)
		k.servers[key] = s
	}
	return s, nil
}

// Close stops every server and refuses further calls. It returns when the
// server processes are gone.
func (k *Kind) Close() error {
	k.mu.Lock()
	k.closed = true
	servers := k.servers
	k.servers = map[string]*server{}
	k.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Go(s.close)
	}
	wg.Wait()
	return nil
}
