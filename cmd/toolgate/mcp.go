package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages/execute/mcptool"
)

// listFlag collects a repeated flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// importMCPCmd registers every tool of an MCP server as mcp:<server>:<tool>.
func importMCPCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tools import-mcp", flag.ContinueOnError)
	url := fs.String("nats", natsURL(), "NATS server URL (default: $NATS_URL, else "+nats.DefaultURL+")")
	var o mcptool.Import
	fs.StringVar(&o.Server, "server", "", "server name: tool ids become mcp:NAME:TOOL (required)")
	fs.StringVar(&o.Risk, "risk", mcptool.DefaultImportRisk, "risk level of every imported tool: low, medium, high or critical")
	sideEffects := fs.String("side-effects", "", "comma-separated side effects of every imported tool (e.g. fs.write,net.post)")
	fs.StringVar(&o.Version, "version", "1.0.0", "version of the imported manifests")
	fs.StringVar(&o.URL, "url", "", "a streamable-HTTP server's endpoint, instead of a command")
	fs.BoolVar(&o.Network, "network", false, "a stdio server asks for the network (given only when a token grants hosts)")
	fs.IntVar(&o.MaxConcurrency, "max-concurrency", 0, "calls in flight per server process (default 4)")
	fs.Int64Var(&o.TimeoutMS, "timeout-ms", 0, "time limit of each call (default 30 s)")
	var readOnly, grant, hosts, env listFlag
	fs.Var(&readOnly, "read-only-path", "absolute host path the server needs, bound read-only (repeatable)")
	fs.Var(&grant, "grant", "directory under the file root the server works in, PATH or PATH:rw (repeatable)")
	fs.Var(&hosts, "host", "host the server may reach (repeatable; the --url host is added)")
	fs.Var(&env, "env", "KEY=VALUE in the server's environment (repeatable)")
	fileRoot := fs.String("file-root", ".", "directory --grant paths are under, as for `serve --file-root`")
	sandboxMode := fs.String("sandbox", sandbox.ModeBwrap, "how the server runs while its tools are listed: bwrap or none")
	replace := fs.Bool("replace", false, "replace tools already registered at this version")
	dryRun := fs.Bool("dry-run", false, "print the manifests instead of registering them")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.Command = fs.Args()
	if o.Server == "" || (len(o.Command) == 0) == (o.URL == "") {
		return errors.New("tools import-mcp: --server NAME and either --url URL or -- COMMAND ARGS... are required")
	}
	if *sideEffects != "" {
		o.SideEffects = strings.Split(*sideEffects, ",")
	}
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
				return fmt.Errorf("--env %q: want KEY=VALUE", kv)
			}
			o.Env[k] = v
		}
	}
	root, err := filepath.Abs(*fileRoot)
	if err != nil {
		return err
	}
	// The operator names the read-only paths here: they are the roots too.
	cfg := mcptool.Config{Sandbox: sandbox.Config{Mode: *sandboxMode, FileRoot: root, ReadOnlyRoots: o.ReadOnlyPaths}}
	if len(o.Command) > 0 && *sandboxMode != sandbox.ModeNone {
		cfg.SandboxErr = sandbox.Available()
	}
	k := mcptool.New(cfg)
	defer k.Close()
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	docs, err := k.Manifests(lctx, o)
	if err != nil {
		return err
	}
	if *dryRun {
		for _, d := range docs {
			fmt.Println(string(d))
		}
		return nil
	}
	c, closeFn, err := connect(*url)
	if err != nil {
		return err
	}
	defer closeFn()
	for _, d := range docs {
		out, err := c.RegisterTool(ctx, d, *replace)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stdout, "registered %s@%s\n", out.ToolID, out.Version)
	}
	return nil
}
