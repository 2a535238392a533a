package mcptool

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/detect"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tooldesc"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/schemas"
)

// Import is what an operator says about a server whose tools are imported.
// Safety comes from here only: what the server says about its tools
// (annotations, titles) is recorded but never decides risk or side effects.
type Import struct {
	Server      string
	Version     string   // default 1.0.0
	Risk        string   // default high: unreviewed tools need approval
	SideEffects []string // applied to every tool of the server
	// The server: Command (stdio) or URL (streamable HTTP).
	Command       []string
	Env           map[string]string
	ReadOnlyPaths []string
	URL           string
	Network       bool
	// Filesystem and Hosts become every tool's permissions: the granted
	// directories a stdio server sees, the hosts it (or the URL) may reach.
	Filesystem     []tools.FilesystemPermission
	Hosts          []tools.NetworkPermission
	MaxConcurrency int
	TimeoutMS      int64
	// Descriptions is what becomes of instructions aimed at the agent in
	// a tool's texts (tooldesc.Refuse, Sanitise or Flag; default Refuse:
	// the registry then refuses the tool, E3865). Secrets are redacted
	// whatever it says.
	Descriptions string
}

// DefaultImportRisk is the risk of imported tools when the operator names
// none: high, so the default policy asks a human until someone has looked.
const DefaultImportRisk = "high"

// Manifests connects to the server (a stdio one in k's sandbox), lists its
// tools and returns a checked manifest for each, with id
// mcp:<server>:<tool>.
func (k *Kind) Manifests(ctx context.Context, o Import) ([][]byte, error) {
	if o.URL != "" {
		if host, port, err := endpoint(o.URL); err == nil && !slices.ContainsFunc(o.Hosts, func(h tools.NetworkPermission) bool {
			return strings.EqualFold(h.Host, host)
		}) {
			o.Hosts = append(o.Hosts, tools.NetworkPermission{Host: host, Port: port})
		}
	}
	probe, err := o.manifest(&mcp.Tool{Name: "probe", InputSchema: map[string]any{"type": "object"}})
	if err != nil {
		return nil, err
	}
	m, err := tools.Parse(probe)
	if err != nil {
		return nil, err
	}
	// The operator is the one asking: grant what the server is declared to need.
	grants := envelope.Grants{PathMode: "rw"}
	for _, h := range o.Hosts {
		grants.Hosts = append(grants.Hosts, h.Host)
	}
	_, srv, err := k.prepare(m, "", grants)
	if err != nil {
		return nil, err
	}
	c, err := srv.get(ctx)
	if err != nil {
		return nil, err
	}
	var out [][]byte
	seen := map[string]string{}
	for t, err := range c.session.Tools(ctx, nil) {
		if err != nil {
			return nil, api.WrapError(err, api.ExternalAPIError, api.EMCPProtocol, "listing the tools of %s: %v", o.Server, err)
		}
		doc, err := o.manifest(t)
		if err != nil {
			return nil, err
		}
		if _, err := tools.Parse(doc); err != nil {
			return nil, fmt.Errorf("tool %q of %s: %w", t.Name, o.Server, err)
		}
		id := ToolID(o.Server, t.Name)
		if prev, dup := seen[id]; dup {
			return nil, fmt.Errorf("tools %q and %q of %s both map to id %s", prev, t.Name, o.Server, id)
		}
		seen[id] = t.Name
		out = append(out, doc)
	}
	return out, nil
}

var toolIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.:-]{0,127}$`)

// ToolID is the toolgate id of a server's tool: mcp:<server>:<tool>, the
// tool's name in lower snake case (getSum → get_sum), since ids are lower
// case; the manifest keeps the exact name to call.
func ToolID(server, tool string) string {
	var b strings.Builder
	prev := rune(0)
	for _, r := range tool {
		switch {
		case unicode.IsUpper(r):
			if unicode.IsLower(prev) || unicode.IsDigit(prev) {
				b.WriteByte('_')
			}
			b.WriteRune(unicode.ToLower(r))
		case r < unicode.MaxASCII && (unicode.IsLower(r) || unicode.IsDigit(r) || r == '_' || r == '-' || r == '.'):
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
		prev = r
	}
	return "mcp:" + server + ":" + b.String()
}

// manifest builds the manifest of one of the server's tools.
func (o Import) manifest(t *mcp.Tool) ([]byte, error) {
	if !serverName.MatchString(o.Server) {
		return nil, fmt.Errorf("server name %q must match %s", o.Server, serverName)
	}
	id := ToolID(o.Server, t.Name)
	if !toolIDPattern.MatchString(id) {
		return nil, fmt.Errorf("tool %q of %s has no usable id (%s)", t.Name, o.Server, id)
	}
	var annotations json.RawMessage
	if t.Annotations != nil {
		var err error
		if annotations, err = json.Marshal(t.Annotations); err != nil {
			return nil, err
		}
	}
	// The pin is of the tool exactly as the server listed it, before
	// anything here shortened or sanitised it.
	digest, err := tooldesc.Digest(t)
	if err != nil {
		return nil, err
	}
	spec := Spec{Server: o.Server, Tool: t.Name, Command: o.Command, Env: o.Env, ReadOnlyPaths: o.ReadOnlyPaths,
		Network: o.Network, URL: o.URL, MaxConcurrency: o.MaxConcurrency, ServerAnnotations: annotations,
		DescriptionDigest: digest}
	rawSpec, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	input, err := schemaOf(t.InputSchema, `{"type":"object"}`)
	if err != nil {
		return nil, fmt.Errorf("tool %q input schema: %w", t.Name, err)
	}
	// Without an output schema the result is the content wrapper.
	output, err := schemaOf(t.OutputSchema, string(schemas.MCPContent()))
	if err != nil {
		return nil, fmt.Errorf("tool %q output schema: %w", t.Name, err)
	}
	name := cmp.Or(t.Title, t.Name)
	if len(name) > 256 {
		name = name[:256]
	}
	desc := t.Description
	if len(desc) > 8192 {
		desc = desc[:8192]
	}
	m := tools.Manifest{
		ID: id, Name: name, Version: cmp.Or(o.Version, "1.0.0"), Description: desc,
		Tags: []string{"mcp", "mcp:" + o.Server}, Kind: "mcp",
		InputSchema: input, OutputSchema: output,
		Safety:      tools.Safety{RiskLevel: cmp.Or(o.Risk, DefaultImportRisk), SideEffects: o.SideEffects},
		Limits:      tools.Limits{TimeoutMS: o.TimeoutMS},
		Permissions: tools.Permissions{Filesystem: o.Filesystem, Network: o.Hosts},
	}
	doc, err := json.Marshal(m.WithSpec(rawSpec))
	if err != nil {
		return nil, err
	}
	return guard(doc, spec, cmp.Or(o.Descriptions, tooldesc.Refuse))
}

// guard applies the description mode to a tool's manifest and records in
// its mcp object what was found and done. Under Refuse what it finds is
// left for the registry to refuse (and audit), secrets excepted.
func guard(doc []byte, spec Spec, mode string) ([]byte, error) {
	out, fs, err := tooldesc.Apply(detect.Default(), doc, mode)
	if err != nil {
		return nil, err
	}
	for _, f := range fs {
		if f.Action != "" {
			spec.DescriptionFindings = append(spec.DescriptionFindings, f)
		}
	}
	if len(spec.DescriptionFindings) == 0 {
		return out, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(out, &m); err != nil {
		return nil, err
	}
	// The mcp object as sanitised, with the record added.
	var applied map[string]json.RawMessage
	if err := json.Unmarshal(m["mcp"], &applied); err != nil {
		return nil, err
	}
	if applied["description_findings"], err = json.Marshal(spec.DescriptionFindings); err != nil {
		return nil, err
	}
	if m["mcp"], err = json.Marshal(applied); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

func schemaOf(v any, fallback string) (json.RawMessage, error) {
	if v == nil {
		return json.RawMessage(fallback), nil
	}
	return json.Marshal(v)
}
