// Package mcptool runs tools of kind mcp: tools served by a Model Context
// Protocol server, reached with the official MCP Go SDK over stdio (a server
// process the execute stage starts in the sandbox and supervises) or over
// streamable HTTP (a server at a URL the manifest's network permissions name).
package mcptool

import (
	"encoding/json"
	"fmt"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/tooldesc"
	"github.com/toolgate/toolgate/internal/tools"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Spec is a manifest's mcp object (schemas/tool-manifest.schema.json).
type Spec struct {
	// Server names the server; with its definition it keys the process.
	Server string `json:"server"`
	// Tool is the tool's name on the server, which may differ from the id.
	Tool string `json:"tool"`
	// Command starts a stdio server in the sandbox (argv, no shell).
	Command []string          `json:"command,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// ReadOnlyPaths are absolute host paths bound read-only at the same
	// place in the sandbox: what the server needs to run (its install).
	ReadOnlyPaths []string `json:"read_only_paths,omitempty"`
	// Network asks for the network; it is given only when the token grants
	// hosts.
	Network bool `json:"network,omitempty"`
	// URL reaches a streamable-HTTP server instead of starting one.
	URL string `json:"url,omitempty"`
	// MaxConcurrency bounds the calls in flight to one server process;
	// default DefaultConcurrency.
	MaxConcurrency int `json:"max_concurrency,omitempty"`
	// ServerAnnotations records what the server said about the tool
	// (readOnlyHint, destructiveHint, ...) when it was imported. Nothing
	// reads it for a decision: a server's claims about itself are hints.
	ServerAnnotations json.RawMessage `json:"server_annotations,omitempty"`
	// DescriptionDigest pins what the server listed at import
	// (tooldesc.Digest of its tool): a later import that sees another is
	// held until an operator accepts it.
	DescriptionDigest string `json:"description_digest,omitempty"`
	// DescriptionFindings records what the import's scan of the server's
	// texts found and did (sanitised, redacted, flagged).
	DescriptionFindings []tooldesc.Finding `json:"description_findings,omitempty"`
}

// DefaultConcurrency is the calls in flight per server when the manifest
// sets no max_concurrency.
const DefaultConcurrency = 4

var serverName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

// Decode reads and checks m's mcp configuration. Failures are E3101: the
// manifest cannot run here, whatever the call.
func Decode(m *tools.Manifest) (*Spec, error) {
	if len(m.Spec()) == 0 {
		return nil, unusable(m, "it has no mcp configuration")
	}
	var s Spec
	if err := json.Unmarshal(m.Spec(), &s); err != nil {
		return nil, unusable(m, "mcp configuration: %v", err)
	}
	if err := s.check(); err != nil {
		return nil, unusable(m, "%v", err)
	}
	return &s, nil
}

func (s *Spec) check() error {
	switch {
	case !serverName.MatchString(s.Server):
		return fmt.Errorf("server %q must match %s", s.Server, serverName)
	case s.Tool == "":
		return fmt.Errorf("no tool name")
	case (len(s.Command) == 0) == (s.URL == ""):
		return fmt.Errorf("exactly one of command and url must be set")
	case s.MaxConcurrency < 0:
		return fmt.Errorf("max_concurrency must be positive")
	}
	for _, p := range s.ReadOnlyPaths {
		if err := checkReadOnlyPath(p); err != nil {
			return err
		}
	}
	if s.URL != "" {
		if _, _, err := endpoint(s.URL); err != nil {
			return err
		}
	}
	return nil
}

// checkReadOnlyPath refuses paths that would hand the server the host's
// kernel interfaces, devices or sockets: /proc, /sys, /dev and /run hold
// them, and "/" holds everything.
func checkReadOnlyPath(p string) error {
	if !filepath.IsAbs(p) {
		return fmt.Errorf("read-only path %q is not absolute", p)
	}
	c := filepath.Clean(p)
	if c == "/" {
		return fmt.Errorf("read-only path %q would expose the whole host", p)
	}
	for _, bad := range []string{"/proc", "/sys", "/dev", "/run", "/var/run"} {
		if c == bad || strings.HasPrefix(c, bad+"/") {
			return fmt.Errorf("read-only path %q is under %s, which is never bound into a sandbox", p, bad)
		}
	}
	return nil
}

// endpoint parses a server URL into its host and port.
func endpoint(raw string) (host string, port int, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", 0, fmt.Errorf("url: %v", err)
	}
	switch u.Scheme {
	case "http":
		port = 80
	case "https":
		port = 443
	default:
		return "", 0, fmt.Errorf("url %q: scheme must be http or https", raw)
	}
	if u.User != nil {
		return "", 0, fmt.Errorf("url %q: credentials do not belong in a manifest", raw)
	}
	host = strings.ToLower(u.Hostname())
	if host == "" {
		return "", 0, fmt.Errorf("url %q has no host", raw)
	}
	if p := u.Port(); p != "" {
		if port, err = strconv.Atoi(p); err != nil {
			return "", 0, fmt.Errorf("url %q: port: %v", raw, err)
		}
	}
	return host, port, nil
}

func unusable(m *tools.Manifest, format string, args ...any) *api.Error {
	return api.NewError(api.ToolExecutionError, api.EExecutorUnavailable,
		"%s cannot run: "+format, append([]any{m.Key()}, args...)...).WithDetail("not_started", true)
}
