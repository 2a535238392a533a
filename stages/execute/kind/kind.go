// Package kind is the contract of a tool kind: what runs the tools of one
// manifest "kind" (builtin, cli, http, mcp, model), and what the other
// stages learn from it. A kind is a value of Kind, declared in its own
// package; the kinds a binary runs are listed in one Registry
// (stages/execute/kinds), which route, authorize and execute are all given.
package kind

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/breaker"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/tools"
)

// Func runs one attempt of a tool. params is the parameters object, already
// checked against the tool's input schema; the result must be JSON (an
// object, for builtins). A Func must return promptly with ctx.Err() once
// ctx is done.
type Func func(ctx context.Context, params json.RawMessage) (json.RawMessage, error)

// Runner runs the tools of one kind (execute.Kind is this interface).
// Prepare is called once per invocation, before the tool is claimed; it
// checks the manifest's configuration and the invocation's grants and
// returns the function that runs one attempt. That function runs under the
// executor's timeout, retry and breaker policies, must stop when its context
// ends, and returns errors as *api.Error (details.not_started = true when
// nothing reached the tool, so retries are safe).
type Runner interface {
	Prepare(m *tools.Manifest, inv *envelope.Invocation) (Func, error)
}

// Kind declares a tool kind.
type Kind struct {
	// Name is the manifest's "kind", and the name of the manifest member
	// that configures a tool of the kind.
	Name string
	// New builds the kind's Runner for one execute stage. Nil means the
	// executor runs the kind itself (builtin: the functions compiled in).
	New func(d *Deps) (Runner, error)
	// Validate, when set, checks a manifest's configuration of the kind
	// (the member named Name) beyond its schema.
	Validate func(spec json.RawMessage) error
	// Resources, when set, says what a call of m with params needs beyond
	// the manifest's permissions (which authorize always counts): the host
	// an http tool's URL parameter names, say. Authorize holds them against
	// the capability token before the call runs.
	Resources func(m *tools.Manifest, params json.RawMessage) (Resources, error)
}

// Resources are what one call needs.
type Resources struct {
	Paths       []Path   `json:"paths"`
	Hosts       []Host   `json:"hosts"`
	Credentials []string `json:"credentials"`
}

// Path is a path under the file root and the access needed (ro or rw).
type Path struct {
	Path string `json:"path"`
	Mode string `json:"mode"`
}

// Host is a host and port (0: any) a call connects to.
type Host struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}

// Secrets resolves a secret's value by name (secrets.Source does).
type Secrets interface {
	Lookup(name string) (string, error)
}

// Deps is what an execute stage gives the kinds it builds: the services
// they share, and each kind's own settings.
type Deps struct {
	Log *slog.Logger
	// Sandbox runs what a kind starts as a process (cli tools, stdio MCP
	// servers); SandboxErr, when set, says why it cannot here.
	Sandbox    sandbox.Config
	SandboxErr error
	// Secrets supplies the credentials tools inject.
	Secrets Secrets
	// AllowPrivateNetworks lets granted host names resolve to loopback,
	// private and link-local addresses.
	AllowPrivateNetworks bool
	// Breakers guard what a kind calls beyond the tool's own breaker.
	Breakers *breaker.Breakers
	// Settings hold kind-specific settings, one value per type (a kind's
	// own Config, say); Setting finds them.
	Settings []any
	// OnStop registers what to release when the stage stops.
	OnStop func(func())

	built map[string]Runner
}

// Setting returns the value of type T among d's settings.
func Setting[T any](d *Deps) (T, bool) {
	for _, s := range d.Settings {
		if v, ok := s.(T); ok {
			return v, true
		}
	}
	var zero T
	return zero, false
}

// Runner returns the runner of a kind built before this one (registration
// order), or nil: the model kind sends its requests through the http
// kind's transport.
func (d *Deps) Runner(name string) Runner { return d.built[name] }

// Release makes f run when the stage stops.
func (d *Deps) Release(f func()) {
	if d.OnStop != nil {
		d.OnStop(f)
	}
}

// Registry holds the kinds a binary runs, in registration order.
type Registry struct {
	kinds []Kind
}

// NewRegistry returns a registry of ks; it panics on a duplicate or
// unnamed kind, which is a programming error of the list that calls it.
func NewRegistry(ks ...Kind) *Registry {
	r := &Registry{}
	for _, k := range ks {
		if err := r.Register(k); err != nil {
			panic(err)
		}
	}
	return r
}

// Register adds k; a kind of the same name is an error.
func (r *Registry) Register(k Kind) error {
	if k.Name == "" {
		return fmt.Errorf("kind: a kind needs a name")
	}
	if _, ok := r.Lookup(k.Name); ok {
		return fmt.Errorf("kind: %s is registered twice", k.Name)
	}
	r.kinds = append(r.kinds, k)
	return nil
}

// With returns a copy of r with ks registered too (a test's extra kind).
func (r *Registry) With(ks ...Kind) (*Registry, error) {
	c := &Registry{kinds: slices.Clone(r.kinds)}
	for _, k := range ks {
		if err := c.Register(k); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Lookup returns the kind of that name. A nil Registry holds none.
func (r *Registry) Lookup(name string) (Kind, bool) {
	if r == nil {
		return Kind{}, false
	}
	i := slices.IndexFunc(r.kinds, func(k Kind) bool { return k.Name == name })
	if i < 0 {
		return Kind{}, false
	}
	return r.kinds[i], true
}

// All returns the kinds in registration order.
func (r *Registry) All() []Kind {
	if r == nil {
		return nil
	}
	return slices.Clone(r.kinds)
}

// Names returns the kinds' names in registration order.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.All()))
	for _, k := range r.All() {
		names = append(names, k.Name)
	}
	return names
}

// Build makes the runner of every kind that has a New, in registration
// order, and passes each to handle.
func (r *Registry) Build(d *Deps, handle func(name string, run Runner)) error {
	d.Log = cmp.Or(d.Log, slog.New(slog.DiscardHandler))
	d.built = map[string]Runner{}
	for _, k := range r.All() {
		if k.New == nil {
			continue
		}
		run, err := k.New(d)
		if err != nil {
			return fmt.Errorf("kind %s: %w", k.Name, err)
		}
		d.built[k.Name] = run
		handle(k.Name, run)
	}
	return nil
}

// Check refuses (invalid_parameters, E3008) a manifest whose kind r does
// not hold, or whose configuration the kind's Validate refuses.
func (r *Registry) Check(m *tools.Manifest) error {
	k, ok := r.Lookup(m.Kind)
	if !ok {
		return api.NewError(api.InvalidParameters, api.EInvalidManifest,
			"%s: kind %q is not one this binary runs", m.Key(), m.Kind).
			WithFields([]api.FieldError{{Location: "/kind", Message: "unknown kind"}})
	}
	if k.Validate == nil {
		return nil
	}
	if err := k.Validate(m.Spec()); err != nil {
		return api.WrapError(err, api.InvalidParameters, api.EInvalidManifest, "%s: %s configuration: %v", m.Key(), k.Name, err).
			WithFields([]api.FieldError{{Location: "/" + k.Name, Message: err.Error()}})
	}
	return nil
}

// Needs is what a call of m with params needs beyond the manifest's
// permissions, by m's kind. It fails closed: a kind r does not hold is an
// error, so a call nobody can account for is never admitted.
func (r *Registry) Needs(m *tools.Manifest, params json.RawMessage) (Resources, error) {
	k, ok := r.Lookup(m.Kind)
	if !ok {
		return Resources{}, api.NewError(api.ToolExecutionError, api.EExecutorUnavailable,
			"no %s kind in this binary to say what a call of %s needs", m.Kind, m.Key())
	}
	if k.Resources == nil {
		return Resources{}, nil
	}
	return k.Resources(m, params)
}
