package authorize

import (
	"cmp"
	"context"
	"encoding/json"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"weak"

	"github.com/open-policy-agent/opa/v1/ast"
	segjson "github.com/segmentio/encoding/json"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/hosts"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages/execute/kind"
)

// Input is what the policy sees as `input`.
type Input struct {
	Request   *api.Request    `json:"request"`
	Tool      *tools.Manifest `json:"tool"`
	Claims    *token.Claims   `json:"claims"`
	Usage     kvstore.Usage   `json:"usage"`
	Resources Resources       `json:"resources"`
	Derived   Derived         `json:"derived"`
	Approval  *ApprovalInput  `json:"approval,omitempty"`
	Tenant    string          `json:"tenant"`
	Time      string          `json:"time"`
}

// Resources are what a call needs: the manifest's permissions, the paths
// among its parameters, and what its kind adds (kind.Kind's Resources).
type Resources = kind.Resources

// PathNeed is a path under the file root and the access needed.
type PathNeed = kind.Path

// HostNeed is a host and port (0: any) a call connects to.
type HostNeed = kind.Host

// Derived are facts about the claims computed in Go, where pattern matching
// has one implementation.
type Derived struct {
	PreApproved bool            `json:"pre_approved"`
	HostGranted map[string]bool `json:"host_granted"`
}

// evalInput evaluates the live policy on in, and returns the input it
// built and the shadow policy in force, which is evaluated on that input
// (shadow.go) without building it again.
func (a *Authorizer) evalInput(ctx context.Context, in Input, rawToken string) (policy.Decision, ast.Value, *shadowPolicy, error) {
	e, sh := a.engine.Load(), a.shadow.Load()
	input, err := a.policyInput(in, rawToken, a.readsOf(e, sh).parts)
	if err != nil {
		return policy.Decision{}, nil, sh, api.WrapError(err, api.InternalError, api.EPolicyFailed, "building policy input: %v", err)
	}
	d, err := e.Eval(ctx, input)
	d.Revision = e.Revision
	return d, input, sh, err
}

// An inputPart is a part of the input that a policy may not read, and
// that is left out of the input when neither the live policy nor the
// shadow reads it (policy.Engine.Reads): a member of the request, the
// time, or the usage's times.
type inputPart uint16

// requestMembers are the request's members in requestTerm's order: the
// first inputParts.
var requestMembers = [...]string{"tool_id", "tool_version", "invocation_id", "agent_context", "parameters",
	"capability_token", "resource_limits", "document_context", "checkpoint_config", "execution_options", "link", "redrive"}

const (
	partTime inputPart = 1 << (len(requestMembers) + iota)
	partUsageTimes
	allParts = partUsageTimes<<1 - 1
)

func requestPart(i int) inputPart { return 1 << i }

// inputReads are the parts the policies e and sh read.
type inputReads struct {
	e     *policy.Engine
	sh    *shadowPolicy
	parts inputPart
}

// readsOf is what e and sh (nil: none) read of the input, worked out once
// per pair of policies.
func (a *Authorizer) readsOf(e *policy.Engine, sh *shadowPolicy) *inputReads {
	if r := a.reads.Load(); r != nil && r.e == e && r.sh == sh {
		return r
	}
	read := func(path ...string) bool { return e.Reads(path...) || sh != nil && sh.engine.Reads(path...) }
	r := &inputReads{e: e, sh: sh}
	for i, name := range requestMembers {
		if read("request", name) {
			r.parts |= requestPart(i)
		}
	}
	if read("time") {
		r.parts |= partTime
	}
	if read("usage", "updated_at") || read("usage", "started_at") || read("usage", "aborted") {
		r.parts |= partUsageTimes
	}
	a.reads.Store(r)
	return r
}

// policyInput is in in the form OPA evaluates: the ast.Value of its JSON
// encoding (TestPolicyInputIsItsJSON holds it to that), but for the
// inputParts not in parts. The manifest's part, the largest and
// the same on every call of a tool version, is converted once per
// manifest; the claims' part, the same on every call with one token, once
// per token (rawToken; linked requests, which have none, convert theirs
// every time). The request goes through its JSON encoding only for its
// rarely set parts (requestTerm); the small fixed-shape parts are built
// directly.
func (a *Authorizer) policyInput(in Input, rawToken string, parts inputPart) (ast.Value, error) {
	req, err := requestTerm(in.Request, parts)
	if err != nil {
		return nil, err
	}
	var tool ast.Value = ast.Null{}
	if m := in.Tool; m != nil {
		if tool, err = a.tools.value(m); err != nil {
			return nil, err
		}
	}
	var claims ast.Value
	if c := in.Claims; rawToken != "" && c != nil {
		claims, err = a.claims.value(rawToken, func() (ast.Value, error) { return astValue(c) })
	} else {
		claims, err = astValue(in.Claims)
	}
	if err != nil {
		return nil, err
	}
	usage, err := usageTerm(in.Usage, parts&partUsageTimes != 0)
	if err != nil {
		return nil, err
	}
	terms := [][2]*ast.Term{
		ast.Item(ast.InternedTerm("request"), req),
		ast.Item(ast.InternedTerm("tool"), ast.NewTerm(tool)),
		ast.Item(ast.InternedTerm("claims"), ast.NewTerm(claims)),
		ast.Item(ast.InternedTerm("usage"), usage),
		ast.Item(ast.InternedTerm("resources"), resourcesTerm(in.Resources)),
		ast.Item(ast.InternedTerm("derived"), derivedTerm(in.Derived)),
		ast.Item(ast.InternedTerm("tenant"), ast.StringTerm(in.Tenant)),
	}
	if parts&partTime != 0 {
		terms = append(terms, ast.Item(ast.InternedTerm("time"), ast.StringTerm(in.Time)))
	}
	if ap := in.Approval; ap != nil {
		fields := [][2]*ast.Term{ast.Item(ast.InternedTerm("state"), ast.StringTerm(ap.State))}
		if ap.DecidedBy != "" {
			fields = append(fields, ast.Item(ast.InternedTerm("decided_by"), ast.StringTerm(ap.DecidedBy)))
		}
		terms = append(terms, ast.Item(ast.InternedTerm("approval"), ast.ObjectTerm(fields...)))
	}
	return ast.NewObject(terms...), nil
}

// requestTerm is r's JSON encoding as a term, with the members parts
// holds (requestMembers) alone. What every call carries (the tool, the agent context, the
// parameters) is built directly; the options only some calls set go
// through their JSON encoding. The strings are the
// envelope's, decoded from JSON, so valid UTF-8 as encoding/json would
// write them.
func requestTerm(r *api.Request, parts inputPart) (*ast.Term, error) {
	if r == nil {
		return ast.NullTerm(), nil
	}
	items := make([][2]*ast.Term, 0, 8)
	str := func(i int, v string, omitEmpty bool) {
		if (v != "" || !omitEmpty) && parts&requestPart(i) != 0 {
			items = append(items, ast.Item(ast.InternedTerm(requestMembers[i]), ast.StringTerm(v)))
		}
	}
	str(0, r.ToolID, false)
	str(1, r.ToolVersion, true)
	str(2, r.InvocationID, true)
	if parts&requestPart(3) != 0 {
		ac := r.AgentContext
		agent := make([][2]*ast.Term, 0, 4)
		agent = append(agent, ast.Item(ast.InternedTerm("agent_did"), ast.StringTerm(ac.AgentDID)),
			ast.Item(ast.InternedTerm("tenant_id"), ast.StringTerm(ac.TenantID)))
		if ac.SessionID != "" {
			agent = append(agent, ast.Item(ast.InternedTerm("session_id"), ast.StringTerm(ac.SessionID)))
		}
		if ac.UserDID != "" {
			agent = append(agent, ast.Item(ast.InternedTerm("user_did"), ast.StringTerm(ac.UserDID)))
		}
		items = append(items, ast.Item(ast.InternedTerm("agent_context"), ast.ObjectTerm(agent...)))
	}
	if parts&requestPart(4) != 0 && len(r.Parameters) > 0 {
		var p any
		if err := segjson.Unmarshal(r.Parameters, &p); err != nil {
			return nil, err
		}
		v, err := ast.InterfaceToValue(p)
		if err != nil {
			return nil, err
		}
		items = append(items, ast.Item(ast.InternedTerm("parameters"), ast.NewTerm(v)))
	}
	str(5, r.CapabilityToken, true)
	for i, o := range [...]struct {
		set bool
		v   any
	}{
		{r.ResourceLimits != nil, r.ResourceLimits},
		{r.DocumentContext != nil, r.DocumentContext},
		{r.CheckpointConfig != nil, r.CheckpointConfig},
		{r.ExecutionOptions != nil, r.ExecutionOptions},
		{r.Link != nil, r.Link},
		{r.Redrive != nil, r.Redrive},
	} {
		if o.set && parts&requestPart(6+i) != 0 {
			v, err := astValue(o.v)
			if err != nil {
				return nil, err
			}
			items = append(items, ast.Item(ast.InternedTerm(requestMembers[6+i]), ast.NewTerm(v)))
		}
	}
	return ast.ObjectTerm(items...), nil
}

// zeroUsage is the policy form of an empty usage (every unmetered call's).
var zeroUsage = func() *ast.Term {
	v, err := astValue(kvstore.Usage{})
	if err != nil {
		panic(err)
	}
	return ast.NewTerm(v)
}()

// usageTerm is u's JSON encoding as a term, built directly for the usage
// a policy is given (its id lists and leases left out), its times only
// when times: a metered call converts one on every call.
func usageTerm(u kvstore.Usage, times bool) (*ast.Term, error) {
	if reflect.ValueOf(u).IsZero() {
		return zeroUsage, nil
	}
	if u.Reserved != nil || u.Settled != nil || u.Leases != nil {
		v, err := astValue(u)
		return ast.NewTerm(v), err
	}
	cost, err := json.Marshal(u.Cost)
	if err != nil {
		return nil, err
	}
	items := [][2]*ast.Term{
		ast.Item(ast.InternedTerm("calls"), intTerm(u.Calls)),
		ast.Item(ast.InternedTerm("runtime_ms"), intTerm(u.RuntimeMS)),
		ast.Item(ast.InternedTerm("cost"), ast.NumberTerm(json.Number(cost))),
		ast.Item(ast.InternedTerm("tokens"), intTerm(u.Tokens)),
		ast.Item(ast.InternedTerm("consecutive_failures"), intTerm(u.ConsecutiveFailures)),
	}
	if !times {
		return ast.ObjectTerm(items...), nil
	}
	if !u.UpdatedAt.IsZero() {
		items = append(items, ast.Item(ast.InternedTerm("updated_at"), timeTerm(u.UpdatedAt)))
	}
	if !u.StartedAt.IsZero() {
		items = append(items, ast.Item(ast.InternedTerm("started_at"), timeTerm(u.StartedAt)))
	}
	if ab := u.Aborted; ab != nil {
		items = append(items, ast.Item(ast.InternedTerm("aborted"), ast.ObjectTerm(
			ast.Item(ast.InternedTerm("invocation_id"), ast.StringTerm(ab.InvocationID)),
			ast.Item(ast.InternedTerm("hook"), ast.StringTerm(ab.Hook)),
			ast.Item(ast.InternedTerm("at"), timeTerm(ab.At)))))
	}
	return ast.ObjectTerm(items...), nil
}

func intTerm(n int64) *ast.Term { return ast.NumberTerm(json.Number(strconv.FormatInt(n, 10))) }

// timeTerm is t as encoding/json writes it.
func timeTerm(t time.Time) *ast.Term { return ast.StringTerm(t.Format(time.RFC3339Nano)) }

// noResources and notDerived are the policy forms of a call that needs
// nothing beyond its tool (the most common), built once.
var (
	noResources *ast.Term
	notDerived  [2]*ast.Term
)

func init() {
	noResources = resourcesTerm(Resources{Paths: []PathNeed{}, Hosts: []HostNeed{}, Credentials: []string{}})
	notDerived = [2]*ast.Term{derivedTerm(Derived{HostGranted: map[string]bool{}}),
		derivedTerm(Derived{PreApproved: true, HostGranted: map[string]bool{}})}
}

// resourcesTerm is r's JSON encoding as a term.
func resourcesTerm(r Resources) *ast.Term {
	if noResources != nil && r.Paths != nil && r.Hosts != nil && r.Credentials != nil &&
		len(r.Paths)+len(r.Hosts)+len(r.Credentials) == 0 {
		return noResources
	}
	var paths, hosts, creds []*ast.Term
	for _, p := range r.Paths {
		paths = append(paths, ast.ObjectTerm(ast.Item(ast.InternedTerm("path"), ast.StringTerm(p.Path)),
			ast.Item(ast.InternedTerm("mode"), ast.StringTerm(p.Mode))))
	}
	for _, h := range r.Hosts {
		hosts = append(hosts, ast.ObjectTerm(ast.Item(ast.InternedTerm("host"), ast.StringTerm(h.Host)),
			ast.Item(ast.InternedTerm("port"), ast.IntNumberTerm(h.Port))))
	}
	for _, c := range r.Credentials {
		creds = append(creds, ast.StringTerm(c))
	}
	return ast.ObjectTerm(
		ast.Item(ast.InternedTerm("paths"), arrayTerm(r.Paths == nil, paths)),
		ast.Item(ast.InternedTerm("hosts"), arrayTerm(r.Hosts == nil, hosts)),
		ast.Item(ast.InternedTerm("credentials"), arrayTerm(r.Credentials == nil, creds)))
}

// derivedTerm is d's JSON encoding as a term.
func derivedTerm(d Derived) *ast.Term {
	if notDerived[0] != nil && d.HostGranted != nil && len(d.HostGranted) == 0 {
		if d.PreApproved {
			return notDerived[1]
		}
		return notDerived[0]
	}
	granted := ast.NullTerm()
	if d.HostGranted != nil {
		items := make([][2]*ast.Term, 0, len(d.HostGranted))
		for h, ok := range d.HostGranted {
			items = append(items, ast.Item(ast.StringTerm(h), ast.BooleanTerm(ok)))
		}
		granted = ast.ObjectTerm(items...)
	}
	return ast.ObjectTerm(ast.Item(ast.InternedTerm("pre_approved"), ast.BooleanTerm(d.PreApproved)),
		ast.Item(ast.InternedTerm("host_granted"), granted))
}

// arrayTerm is an array, or null for a nil slice, as encoding/json writes.
func arrayTerm(null bool, elems []*ast.Term) *ast.Term {
	if null {
		return ast.NullTerm()
	}
	return ast.ArrayTerm(elems...)
}

// astValue is v's JSON encoding as an ast.Value.
func astValue(v any) (ast.Value, error) {
	p, err := plain(v)
	if err != nil {
		return nil, err
	}
	return ast.InterfaceToValue(p)
}

// maxCachedTokens and maxCachedTokenBytes bound the tokens whose forms are
// kept and their length; past either the cache starts again empty. A
// token's claims' form weighs about a kilobyte.
const (
	maxCachedTokens     = 4096
	maxCachedTokenBytes = 8 << 20
)

// forms keeps forms of values that do not change by the raw token that
// names them (its verified claims): keyed by the whole token, as the
// verifier's cache is, since a map's hash of it costs a fraction of a
// digest and an equal key is the very token.
type forms[V any] struct {
	mu    sync.Mutex
	m     map[string]V
	bytes int // the keys' length
}

func (c *forms[V]) value(k string, make func() (V, error)) (V, error) {
	c.mu.Lock()
	v, ok := c.m[k]
	c.mu.Unlock()
	if ok {
		return v, nil
	}
	v, err := make()
	if err != nil {
		return v, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedTokens || c.bytes+len(k) > maxCachedTokenBytes {
		c.m, c.bytes = map[string]V{}, 0
	}
	if _, ok := c.m[k]; !ok {
		c.bytes += len(k)
	}
	c.m[k] = v
	c.mu.Unlock()
	return v, nil
}

// manifestForms keeps the policy form of each manifest for as long as the
// manifest lives. The registry hands out one *tools.Manifest per registered
// version and replaces, never changes, it when the version is registered
// again; the form of a replaced or deleted one goes when the collector
// takes the manifest. So every registered tool's manifest is converted
// once, however many are called, at a memory cost in proportion to the
// registry's own.
type manifestForms struct {
	mu sync.Mutex
	m  map[weak.Pointer[tools.Manifest]]ast.Value
}

func (c *manifestForms) value(m *tools.Manifest) (ast.Value, error) {
	k := weak.Make(m)
	c.mu.Lock()
	v, ok := c.m[k]
	c.mu.Unlock()
	if ok {
		return v, nil
	}
	v, err := astValue(m)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok {
		if c.m == nil {
			c.m = map[weak.Pointer[tools.Manifest]]ast.Value{}
		}
		c.m[k] = v
		runtime.AddCleanup(m, c.drop, k)
	}
	return v, nil
}

func (c *manifestForms) drop(k weak.Pointer[tools.Manifest]) {
	c.mu.Lock()
	delete(c.m, k)
	c.mu.Unlock()
}

// denial turns a policy's refusal into the error of its code.
func denial(d policy.Decision) error {
	code, ecode := api.PermissionDenied, api.EPolicyDenied
	switch d.Code {
	case api.EFilesystemDenied, api.ENetworkDenied, api.ECredentialDenied, api.ENotGranted:
		ecode = d.Code
	case api.EBudgetExhausted:
		code, ecode = api.ResourceExhausted, d.Code
	}
	return api.NewError(code, ecode, "denied by policy: %s", strings.Join(d.Reasons, "; ")).WithDetail("reasons", d.Reasons)
}

// resources lists what a call of m with params needs. A kind kinds does
// not hold is an error: what its calls need cannot be known, so none is
// admitted.
func resources(kinds *kind.Registry, m *tools.Manifest, params json.RawMessage) (Resources, error) {
	extra, err := kinds.Needs(m, params)
	if err != nil {
		return Resources{}, err
	}
	r := Resources{Paths: []PathNeed{}, Hosts: []HostNeed{}, Credentials: []string{}}
	writes := slices.ContainsFunc(m.Safety.SideEffects, func(s string) bool { return strings.HasPrefix(s, "fs.write") })
	paramMode := "ro"
	if writes {
		paramMode = "rw"
	}
	// The paths a call names are what it needs; the manifest's filesystem
	// permissions (its widest reach) count only for tools that name none.
	if named := m.PathParameters(params); len(named) > 0 {
		for _, p := range named {
			// Validate refused climbing paths; what is left names a
			// place under the file root.
			if c, err := token.CleanPath(p); err == nil {
				r.Paths = append(r.Paths, PathNeed{Path: c, Mode: paramMode})
			}
		}
	} else {
		for _, p := range m.Permissions.Filesystem {
			if c, err := token.CleanPath(p.Path); err == nil {
				r.Paths = append(r.Paths, PathNeed{Path: c, Mode: cmp.Or(p.Mode, "ro")})
			}
		}
	}
	for _, n := range m.Permissions.Network {
		r.Hosts = append(r.Hosts, HostNeed{Host: strings.ToLower(n.Host), Port: n.Port})
	}
	r.Credentials = append(r.Credentials, m.Permissions.Credentials...)
	// What the kind adds: the host an http tool's URL parameter names, say.
	for _, p := range extra.Paths {
		if !slices.Contains(r.Paths, p) {
			r.Paths = append(r.Paths, p)
		}
	}
	for _, h := range extra.Hosts {
		if !slices.Contains(r.Hosts, h) {
			r.Hosts = append(r.Hosts, h)
		}
	}
	for _, c := range extra.Credentials {
		if !slices.Contains(r.Credentials, c) {
			r.Credentials = append(r.Credentials, c)
		}
	}
	return r, nil
}

func derive(c *token.Claims, m *tools.Manifest, r Resources) Derived {
	d := Derived{PreApproved: c.PreApproved.Match(m.ID), HostGranted: map[string]bool{}}
	for _, h := range r.Hosts {
		if c.Network != nil && hosts.Any(c.Network.AllowedHosts, h.Host) {
			d.HostGranted[h.Host] = true
		}
	}
	return d
}

// plain turns v into the map/slice/number form OPA reads fastest and that
// follows the JSON field names. encoding/json's bytes (envelope.Marshal)
// are read back by github.com/segmentio/encoding/json, to the same values
// in a fraction of the time and allocations (TestPolicyInputIsItsJSON
// holds the input to encoding/json's reading).
func plain(v any) (any, error) {
	b, err := envelope.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	return out, segjson.Unmarshal(b, &out)
}

// The names the policy input is made of are interned in OPA's table, so
// that building an input takes their terms from there instead of making
// them on every call: the input's own keys and the JSON names of a request
// (ast.InternStringTerm may only be called while packages initialise).
func init() {
	ast.InternStringTerm("request", "tool", "claims", "usage", "resources", "derived", "tenant", "time", "approval",
		"state", "decided_by", "calls", "runtime_ms", "cost", "tokens", "consecutive_failures", "updated_at",
		"started_at", "aborted", "invocation_id", "hook", "at", "path", "mode", "host", "port", "paths", "hosts",
		"credentials", "pre_approved", "host_granted")
	ast.InternStringTerm(jsonNames(reflect.TypeFor[api.Request](), map[reflect.Type]bool{})...)
}

// jsonNames lists the JSON field names of t's structs, nested ones too.
func jsonNames(t reflect.Type, seen map[reflect.Type]bool) []string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || seen[t] {
		return nil
	}
	seen[t] = true
	var names []string
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-":
			continue
		case name == "" && f.Anonymous:
		case name == "":
			names = append(names, f.Name)
		default:
			names = append(names, name)
		}
		names = append(names, jsonNames(f.Type, seen)...)
	}
	return names
}
