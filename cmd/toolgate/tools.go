package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/detect"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/tooldesc"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages/execute/mcptool"
)

func (a *app) toolsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tools",
		Short: "Manage the tool registry: list, search, stats, get, init, register, deprecate, sunset, delete, purge, import-mcp, accept",
		Args:  subcommand,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.toolsListCmd(), a.toolsSearchCmd(), a.toolsStatsCmd(), a.toolsGetCmd(), a.toolsInitCmd(), a.toolsRegisterCmd(),
		a.toolsLifecycleCmd(tools.StateDeprecated), a.toolsLifecycleCmd(tools.StateSunset), a.toolsDeleteCmd(), a.toolsPurgeCmd(), a.importMCPCmd(), a.toolsAcceptCmd())
	return cmd
}

func (a *app) toolsListCmd() *cobra.Command {
	var f api.ListRequest
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the registered tools",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, closeFn, err := a.client()
			if err != nil {
				return err
			}
			defer closeFn()
			var out api.ListResponse
			if a.asAgent() {
				// An agent lists through its tenant's endpoint, every page.
				tenant, err := a.tenant()
				if err != nil {
					return err
				}
				r := f
				for {
					page, err := c.SearchTools(cmd.Context(), tenant, r)
					if err != nil {
						return err
					}
					out.Tools, out.TotalCount = append(out.Tools, page.Tools...), page.TotalCount
					if r.Cursor = page.NextCursor; r.Cursor == "" {
						break
					}
				}
			} else if out, err = c.ListTools(cmd.Context(), f); err != nil {
				return err
			}
			return a.emit(out, func(w io.Writer) error {
				rows := make([][]string, 0, len(out.Tools))
				for _, t := range out.Tools {
					approval := ""
					if t.RequiresApproval {
						approval = "approval"
					}
					row := []string{t.ToolID, t.LatestVersion, t.Kind, or(t.RiskLevel, "-"), approval, truncate(t.Description, 60)}
					if f.All {
						row = append(row[:5:5], t.State, row[5])
					}
					rows = append(rows, row)
				}
				if f.All {
					return table(w, []string{"TOOL", "LATEST", "KIND", "RISK", "", "STATE", "DESCRIPTION"}, rows)
				}
				return table(w, []string{"TOOL", "LATEST", "KIND", "RISK", "", "DESCRIPTION"}, rows)
			})
		},
	}
	cmd.Flags().StringVar(&f.Category, "category", "", "only this category")
	cmd.Flags().StringVar(&f.Tag, "tag", "", "only tools with this tag")
	cmd.Flags().BoolVar(&f.All, "all", false, "also tools with no version serving (removed or sunset), with their state")
	return cmd
}

func truncate(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func (a *app) toolsGetCmd() *cobra.Command {
	var version, format string
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Print a tool's manifest (latest version, or --version)",
		Args:  exactArgs(1, "a tool id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, closeFn, err := a.client()
			if err != nil {
				return err
			}
			defer closeFn()
			var out json.RawMessage
			if a.asAgent() {
				tenant, terr := a.tenant()
				if terr != nil {
					return terr
				}
				out, err = c.GetTenantTool(cmd.Context(), tenant, args[0], version)
			} else {
				out, err = c.GetTool(cmd.Context(), args[0], version)
			}
			if err != nil {
				return err
			}
			switch format {
			case "toolgate":
			case "seed":
				if out, err = tools.SeedForm(out); err != nil {
					return err
				}
			default:
				return usageErr("--format %q: want toolgate or seed", format)
			}
			_, err = fmt.Fprintln(a.stdout, indentJSON(out, ""))
			return err
		},
	}
	cmd.Flags().StringVar(&version, "version", "", "exact version or semver range (default: latest)")
	cmd.Flags().StringVar(&format, "format", "toolgate", "toolgate, or seed for the specification's manifest form (tool_id, parameters_schema, execution_config, the rest in x-toolgate), which register takes too")
	return cmd
}

func (a *app) toolsRegisterCmd() *cobra.Command {
	var replace bool
	cmd := &cobra.Command{
		Use:   "register FILE",
		Short: "Register a tool manifest (JSON; - reads stdin)",
		Args:  exactArgs(1, "a manifest file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			doc, err := a.readFile(args[0])
			if err != nil {
				return err
			}
			c, closeFn, err := a.adminClient()
			if err != nil {
				return err
			}
			defer closeFn()
			out, err := c.RegisterTool(cmd.Context(), doc, replace)
			if err != nil {
				return err
			}
			return a.emit(out, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "registered %s@%s\n", out.ToolID, out.Version)
				return err
			})
		},
	}
	cmd.Flags().BoolVar(&replace, "replace", false, "replace an existing id and version")
	return cmd
}

// initManifest is the manifest tools init writes: every section filled in
// with values to edit, valid as it stands (a builtin echo).
func initManifest(id string) map[string]any {
	return map[string]any{
		"id":          id,
		"name":        id,
		"version":     "0.1.0",
		"description": "Say what the tool does, for the agent that chooses it.",
		"category":    "utility",
		"tags":        []string{"draft"},
		"kind":        "builtin",
		"builtin":     map[string]any{"function": "echo"},
		"input_schema": map[string]any{
			"type": "object",
			"properties": map[string]any{
				"message": map[string]any{"type": "string", "maxLength": 4096, "description": "What to echo."},
			},
			"required":             []string{"message"},
			"additionalProperties": false,
		},
		"output_schema": map[string]any{
			"type":       "object",
			"properties": map[string]any{"message": map[string]any{"type": "string"}},
			"required":   []string{"message"},
		},
		"safety":          map[string]any{"risk_level": "low", "side_effects": []string{}, "requires_approval": false, "reversible": true, "idempotent": true},
		"limits":          map[string]any{"timeout_ms": 5000, "memory_mb": 128, "output_bytes": 65536},
		"rate_limit":      map[string]any{"requests": 60, "per_seconds": 60, "burst": 10},
		"retry_policy":    map[string]any{"max_attempts": 2, "base_delay_ms": 200, "max_delay_ms": 2000},
		"circuit_breaker": map[string]any{"failure_rate_threshold": 50, "minimum_calls": 10, "wait_duration_seconds": 30},
		"cost":            map[string]any{"per_call": 0, "currency": "USD", "typical_latency_ms": 5},
		"output_policy":   map[string]any{"mode": "strict"},
		"lifecycle":       map[string]any{"state": "active"},
		"hooks":           []map[string]any{{"name": "give-up", "on": "circuit_open", "action": "fail"}},
	}
}

func (a *app) toolsInitCmd() *cobra.Command {
	var out string
	var force bool
	cmd := &cobra.Command{
		Use:   "init ID",
		Short: "Write a complete manifest to start a tool from (a builtin echo; valid as written)",
		Example: `  toolgate tools init my.tool --out my-tool.json
  toolgate tools register my-tool.json`,
		Args: exactArgs(1, "the new tool's id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			doc, err := json.MarshalIndent(initManifest(args[0]), "", "  ")
			if err != nil {
				return err
			}
			doc = append(doc, '\n')
			if _, err := tools.Parse(doc); err != nil {
				return usageErr("%v", err)
			}
			if out == "" || out == "-" {
				_, err = a.stdout.Write(doc)
				return err
			}
			flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
			if force {
				flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
			}
			f, err := os.OpenFile(out, flags, 0o644)
			if errors.Is(err, os.ErrExist) {
				return fmt.Errorf("%s exists (use --force to replace it)", out)
			} else if err != nil {
				return err
			}
			if _, err := f.Write(doc); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			fmt.Fprintf(a.stderr, "wrote %s; edit it, then: toolgate tools register %s\n", out, out)
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "out", "o", "", "file to write (default: stdout)")
	cmd.Flags().BoolVar(&force, "force", false, "replace an existing file")
	return cmd
}

func (a *app) toolsDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "delete ID VERSION | ID@VERSION",
		Short: "Remove one version of a tool: it serves no call, its manifest stays for the record (tools purge deletes it)",
		Args:  toolVersionArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			id, version := toolVersion(args)
			c, closeFn, err := a.adminClient()
			if err != nil {
				return err
			}
			defer closeFn()
			doc, err := c.DeleteTool(cmd.Context(), id, version)
			if err != nil {
				return err
			}
			return a.emit(doc, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "removed %s@%s\n", id, version)
				return err
			})
		},
	}
}

func (a *app) toolsAcceptCmd() *cobra.Command {
	var digest string
	cmd := &cobra.Command{
		Use:   "accept ID VERSION | ID@VERSION --digest D",
		Short: "Serve the change an imported tool's server made, held since its import saw it (tools get shows it)",
		Args:  toolVersionArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if digest == "" {
				return usageErr("tools accept: --digest is required: the held change's, as tools get shows it")
			}
			id, version := toolVersion(args)
			c, closeFn, err := a.adminClient()
			if err != nil {
				return err
			}
			defer closeFn()
			out, err := c.AcceptToolChange(cmd.Context(), id, version, digest)
			if err != nil {
				return err
			}
			return a.emit(out, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "accepted %s@%s %s\n", out.ToolID, out.Version, digest)
				return err
			})
		},
	}
	cmd.Flags().StringVar(&digest, "digest", "", "digest of the held change (pending_change.digest of tools get)")
	return cmd
}

func (a *app) toolsPurgeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "purge ID VERSION | ID@VERSION",
		Short: "Delete one version of a tool for good, manifest and all (the audit trail keeps its registration and removal)",
		Args:  toolVersionArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			id, version := toolVersion(args)
			c, closeFn, err := a.adminClient()
			if err != nil {
				return err
			}
			defer closeFn()
			if err := c.PurgeTool(cmd.Context(), id, version); err != nil {
				return err
			}
			return a.emit(api.ToolRequest{ToolID: id, Version: version}, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "purged %s@%s\n", id, version)
				return err
			})
		},
	}
}

// toolVersionArgs takes a tool id and an exact version, as two arguments
// or as ID@VERSION.
func toolVersionArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 1 {
		if id, v, ok := strings.Cut(args[0], "@"); ok && id != "" && v != "" {
			return nil
		}
	}
	return exactArgs(2, "a tool id and an exact version (ID VERSION or ID@VERSION)")(cmd, args)
}

func toolVersion(args []string) (id, version string) {
	if len(args) == 1 {
		id, version, _ = strings.Cut(args[0], "@")
		return id, version
	}
	return args[0], args[1]
}

// toolsLifecycleCmd moves a version to deprecated or sunset: the manifest
// is read and registered again (replace) with its new lifecycle.
func (a *app) toolsLifecycleCmd(state string) *cobra.Command {
	var inFavorOf, at string
	verb := map[string]string{tools.StateDeprecated: "deprecate", tools.StateSunset: "sunset"}[state]
	dateKey := map[string]string{tools.StateDeprecated: "deprecation_date", tools.StateSunset: "sunset_at"}[state]
	cmd := &cobra.Command{
		Use: verb + " ID VERSION",
		Short: map[string]string{
			tools.StateDeprecated: "Mark a version deprecated, now or --at a time: it still serves, callers get a warning, latest prefers active versions",
			tools.StateSunset:     "Sunset a version, now or --at a time: from then only exact-version calls reach it (tools delete removes it)",
		}[state],
		Args: exactArgs(2, "a tool id and an exact version"),
		RunE: func(cmd *cobra.Command, args []string) error {
			lc := map[string]any{}
			if inFavorOf != "" {
				lc["deprecated_in_favor_of"] = inFavorOf
			}
			when := time.Now()
			if at != "" {
				t, err := time.Parse(time.RFC3339, at)
				if err != nil {
					return usageErr("--at: want RFC 3339 (2026-12-31T00:00:00Z): %v", err)
				}
				when = t
				lc[dateKey] = t.UTC().Format(time.RFC3339)
			}
			// A date to come is scheduled: the version moves on by itself
			// when it passes (a sunset to come is announced as deprecated).
			switch {
			case !when.After(time.Now()):
				lc["state"] = state
			case state == tools.StateSunset:
				lc["state"] = tools.StateDeprecated
			}
			c, closeFn, err := a.adminClient()
			if err != nil {
				return err
			}
			defer closeFn()
			out, err := c.SetLifecycle(cmd.Context(), args[0], args[1], lc)
			if err != nil {
				return err
			}
			return a.emit(map[string]any{"tool_id": out.ToolID, "version": out.Version, "lifecycle": lc}, func(w io.Writer) error {
				if when.After(time.Now()) {
					_, err := fmt.Fprintf(w, "%s@%s becomes %s at %s\n", out.ToolID, out.Version, state, when.UTC().Format(time.RFC3339))
					return err
				}
				_, err := fmt.Fprintf(w, "%s@%s is %s\n", out.ToolID, out.Version, state)
				return err
			})
		},
	}
	cmd.Flags().StringVar(&inFavorOf, "in-favor-of", "", "the version or tool to use instead")
	cmd.Flags().StringVar(&at, "at", "", "when it takes effect, RFC 3339 (default: now)")
	return cmd
}

// importMCPCmd registers every tool of an MCP server as mcp:<server>:<tool>.
func (a *app) importMCPCmd() *cobra.Command {
	var o mcptool.Import
	var sideEffects, readOnly, grant, hosts, env []string
	var fileRoot, sandboxMode string
	var replace, dryRun bool
	cmd := &cobra.Command{
		Use:   "import-mcp --server NAME (--url URL | -- COMMAND [ARGS...])",
		Short: "Register every tool of an MCP server as mcp:NAME:TOOL",
		Example: `  toolgate tools import-mcp --server everything --risk low -- npx @modelcontextprotocol/server-everything
  toolgate tools import-mcp --server remote --url https://mcp.example.com/mcp --dry-run`,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Command = args
			if o.Server == "" || (len(o.Command) == 0) == (o.URL == "") {
				return usageErr("tools import-mcp: --server NAME and either --url URL or -- COMMAND ARGS... are required")
			}
			o.SideEffects = sideEffects
			for _, p := range readOnly {
				abs, err := filepath.Abs(p)
				if err != nil {
					return err
				}
				o.ReadOnlyPaths = append(o.ReadOnlyPaths, abs)
			}
			for _, g := range grant {
				path, mode, _ := strings.Cut(g, ":")
				if mode == "" {
					mode = "ro"
				}
				o.Filesystem = append(o.Filesystem, tools.FilesystemPermission{Path: path, Mode: mode})
			}
			for _, h := range hosts {
				o.Hosts = append(o.Hosts, tools.NetworkPermission{Host: h})
			}
			if len(env) > 0 {
				o.Env = map[string]string{}
				for _, kv := range env {
					k, v, ok := strings.Cut(kv, "=")
					if !ok {
						return usageErr("--env %q: want KEY=VALUE", kv)
					}
					o.Env[k] = v
				}
			}
			root, err := filepath.Abs(fileRoot)
			if err != nil {
				return err
			}
			// The operator names the read-only paths here: they are the roots too.
			cfg := mcptool.Config{Sandbox: sandbox.Config{Mode: sandboxMode, FileRoot: root, ReadOnlyRoots: o.ReadOnlyPaths}}
			if len(o.Command) > 0 && sandboxMode != sandbox.ModeNone {
				cfg.SandboxErr = sandbox.Available()
			}
			k := mcptool.New(cfg)
			defer k.Close()
			ctx := cmd.Context()
			lctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			if err := tooldesc.CheckMode(o.Descriptions); err != nil {
				return usageErr("--descriptions: %v", err)
			}
			docs, err := k.Manifests(lctx, o)
			if err != nil {
				return err
			}
			// A tool the registry will refuse for its texts goes first, so
			// that nothing of the server is registered (and the refusal is
			// audited); a dry run refuses it here.
			var refused, clean [][]byte
			for _, d := range docs {
				if len(refusedTexts(d)) > 0 {
					refused = append(refused, d)
				} else {
					clean = append(clean, d)
				}
			}
			docs = append(refused, clean...)
			if dryRun {
				if len(refused) > 0 {
					return tooldesc.Refusal(toolID(refused[0]), refusedTexts(refused[0]))
				}
				for _, d := range docs {
					fmt.Fprintln(a.stdout, string(d))
				}
				return nil
			}
			c, closeFn, err := a.adminClient()
			if err != nil {
				return err
			}
			defer closeFn()
			var done []api.ToolRequest
			var held error
			for _, d := range docs {
				out, err := c.RegisterTool(ctx, d, replace)
				var te *api.Error
				if errors.As(err, &te) && te.ECode == api.EToolChangeHeld {
					// The pinned text stays served; the others go on.
					fmt.Fprintf(a.stderr, "held %s: %s\n", toolID(d), te.Message)
					held = err
					continue
				}
				if err != nil {
					return err
				}
				done = append(done, out)
				if !a.json {
					fmt.Fprintf(a.stdout, "registered %s@%s\n", out.ToolID, out.Version)
				}
			}
			if held != nil {
				return held
			}
			if a.json {
				return a.printJSON(done)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Server, "server", "", "server name: tool ids become mcp:NAME:TOOL (required)")
	f.StringVar(&o.Risk, "risk", mcptool.DefaultImportRisk, "risk level of every imported tool: low, medium, high or critical")
	f.StringSliceVar(&sideEffects, "side-effects", nil, "side effects of every imported tool (comma-separated or repeated: fs.write,net.post)")
	f.StringVar(&o.Version, "version", "1.0.0", "version of the imported manifests")
	f.StringVar(&o.URL, "url", "", "a streamable-HTTP server's endpoint, instead of a command")
	f.BoolVar(&o.Network, "network", false, "a stdio server asks for the network (given only when a token grants hosts)")
	f.IntVar(&o.MaxConcurrency, "max-concurrency", 0, "calls in flight per server process (default 4)")
	f.Int64Var(&o.TimeoutMS, "timeout-ms", 0, "time limit of each call (default 30 s)")
	f.StringSliceVar(&readOnly, "read-only-path", nil, "absolute host path the server needs, bound read-only (comma-separated or repeated)")
	f.StringSliceVar(&grant, "grant", nil, "directory under the file root the server works in, PATH or PATH:rw (comma-separated or repeated)")
	f.StringSliceVar(&hosts, "host", nil, "host the server may reach (comma-separated or repeated; the --url host is added)")
	f.StringArrayVar(&env, "env", nil, "KEY=VALUE in the server's environment (repeatable)")
	f.StringVar(&fileRoot, "file-root", ".", "directory --grant paths are under, as for serve --file-root")
	f.StringVar(&sandboxMode, "sandbox", sandbox.ModeBwrap, "how the server runs while its tools are listed: bwrap or none")
	f.StringVar(&o.Descriptions, "descriptions", tooldesc.Refuse, "what becomes of text aimed at the agent in a tool's description, schemas or annotations: refuse (the tool is not registered), sanitise (replaced by a marker) or flag (kept, marked, shown with a warning); secrets are redacted whatever it says")
	f.BoolVar(&replace, "replace", false, "replace tools already registered at this version (a tool whose server lists it otherwise than at its import is held until tools accept)")
	f.BoolVar(&dryRun, "dry-run", false, "print the manifests instead of registering them")
	_ = cmd.MarkFlagRequired("server")
	return cmd
}

// refusedTexts is what the registry would refuse in manifest doc's texts.
func refusedTexts(doc []byte) []tooldesc.Finding {
	bad, _ := tooldesc.Check(detect.Default(), doc)
	return bad
}

func toolID(doc []byte) string {
	var m struct{ ID string }
	_ = json.Unmarshal(doc, &m)
	return m.ID
}
