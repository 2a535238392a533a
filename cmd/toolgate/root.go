package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/toolgate/toolgate/api"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/connect"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"golang.org/x/term"
)

// app is what every command shares: the connection settings, the output
// mode and the streams.
type app struct {
	conn   connect.Options
	json   bool
	data   string // a local serve's data directory, for its development token
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	color  bool
}

// run executes the command line args and returns the exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	if f, ok := stdout.(*os.File); ok && os.Getenv("NO_COLOR") == "" && term.IsTerminal(int(f.Fd())) {
		a.color = true
	}
	root := a.root()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	code := codeOf(err)
	var ce *codeError
	if err != nil && !(errors.As(err, &ce) && ce.shown) {
		fmt.Fprintln(stderr, "toolgate:", err)
		// Which members of a refused document are wrong, one a line.
		if te := (*api.Error)(nil); errors.As(err, &te) {
			for _, f := range te.Fields {
				fmt.Fprintf(stderr, "  %s: %s\n", f.Location, f.Message)
			}
		}
		if code == exitUsage {
			fmt.Fprintln(stderr, "Run 'toolgate --help' (or 'toolgate COMMAND --help') for usage.")
		}
	}
	return code
}

func (a *app) root() *cobra.Command {
	root := &cobra.Command{
		Use:   "toolgate",
		Short: "toolgate: the tool-execution layer for AI agents",
		Long: `toolgate: the tool-execution layer for AI agents.

One binary serves the pipeline (validate, authorize, route, execute, verify,
audit over NATS JetStream), runs single stages, and talks to a running
toolgate. Client commands share the connection flags below; output is for
people unless --json is given. Exit status: 0 success, 1 error, 2 usage,
3 no connection, 4 denied, 5 timeout, 6 cancelled; the bus refused: 7 not
permitted, 8 expired, 9 revoked, 10 another tenant, 11 no inbox prefix,
12 credentials not accepted; 130 interrupted (see docs/cli.md).`,
		SilenceErrors: true,
		SilenceUsage:  true,
		// A bare `toolgate` shows the help.
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		PersistentPreRun: func(cmd *cobra.Command, _ []string) {
			a.conn.Resolve()
			// A local serve's operator credentials, when nothing else
			// names who connects and --data names that serve: never from a
			// data directory that merely happens to lie where the command
			// runs, or a command an agent runs there would act as operator.
			if f := cmd.Flags().Lookup("data"); f != nil && f.Changed {
				if p := filepath.Join(a.data, busauth.DirName, busauth.OperatorCredsFile); fileExists(p) {
					a.conn.LocalCreds = p
				}
			}
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &codeError{code: exitUsage, err: err}
	})
	pf := root.PersistentFlags()
	a.conn.AddFlags(pf)
	pf.BoolVar(&a.json, "json", false, "print JSON for scripts instead of text for people")
	pf.StringVar(&a.data, "data", "toolgate-data", "data directory of a local serve: its development token when no --token is given; given explicitly, its operator credentials when nothing else names who connects")
	root.AddGroup(&cobra.Group{ID: "run", Title: "Running toolgate:"},
		&cobra.Group{ID: "call", Title: "Calling tools:"},
		&cobra.Group{ID: "admin", Title: "Administration:"})
	for _, c := range []*cobra.Command{a.serveCmd(), a.stageCmd(), a.setupCmd(), a.benchCmd()} {
		c.GroupID = "run"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.invokeCmd(), a.statusCmd(), a.cancelCmd(), a.tailCmd(), a.mcpCmd(), a.capabilityCmd()} {
		c.GroupID = "call"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.toolsCmd(), a.tokenCmd(), a.policyCmd(), a.hooksCmd(), a.approveCmd(true), a.approveCmd(false),
		a.approvalsCmd(), a.breakersCmd(), a.modelsCmd(), a.docsCmd(), a.budgetsCmd(), a.auditCmd(), a.redriveCmd(), a.credsCmd(), a.siteCmd(), a.consoleCmd(),
		a.checkpointsCmd(), a.receiptCmd()} {
		c.GroupID = "admin"
		root.AddCommand(c)
	}
	root.AddCommand(a.versionCmd())
	groupsCheckArgs(root)
	return root
}

// exactArgs is cobra.ExactArgs naming what the arguments are.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageErr("%s: want %s, got %d argument(s)", cmd.CommandPath(), what, len(args))
		}
		return nil
	}
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) != 0 {
		return usageErr("%s takes no arguments, got %q", cmd.CommandPath(), args)
	}
	return nil
}

// capToken is the capability token of invocations: --token or
// $TOOLGATE_TOKEN, else the development token a local serve --examples
// wrote into its data directory.
func (a *app) capToken() string {
	if a.conn.Token != "" {
		return a.conn.Token
	}
	if b, err := os.ReadFile(node.DevTokenPath(a.data)); err == nil {
		return strings.TrimSpace(string(b))
	}
	return ""
}

// budgetKey is the key the capability token's budget is kept under: its
// root token's (token.BudgetKey).
func (a *app) budgetKey() (string, error) {
	raw := a.capToken()
	if raw == "" {
		return "", usageErr("no capability token whose budget to show: give --token (or TOOLGATE_TOKEN), or --session token:<jti>")
	}
	var c token.Claims
	if _, _, err := jwt.NewParser().ParseUnverified(raw, &c); err != nil {
		return "", usageErr("the capability token: %v", err)
	}
	return token.BudgetKey(c.Root()), nil
}

// tenant is --tenant, else the tenant of the capability token.
// A token that is no JWT at all is refused as the bus would refuse it (E3223,
// exit 12), not as an unexplained local error.
func (a *app) tenant() (string, error) {
	t, err := a.conn.TenantFor(a.capToken())
	if err != nil && !errors.Is(err, connect.ErrNoTenant) {
		return "", malformedToken(err, a.tokenSource(), err)
	}
	return t, err
}

// tokenSource says which capability token commands use and where it came
// from.
func (a *app) tokenSource() string {
	if a.conn.Token != "" {
		if id := a.conn.Identity(); id.Kind == "token" {
			return id.String()
		}
		return "the capability token (from --token or $TOOLGATE_TOKEN)"
	}
	return "the development token (from " + node.DevTokenPath(a.data) + ")"
}

// asAgent reports whether commands connect as the agent of the capability
// token (--token, TOOLGATE_TOKEN or an agent's context, no explicit flag
// naming other credentials): such a connection may call only its tenant's
// scoped endpoints.
func (a *app) asAgent() bool { return a.conn.Identity().Kind == "token" }

// client connects and returns a client and a function that closes it.
// tenantClient is the tenant a command acts for and a client connected for
// it; the tenant is settled first, so a missing one fails before connecting.
func (a *app) tenantClient() (string, *client.Client, func(), error) {
	tenant, err := a.tenant()
	if err != nil {
		return "", nil, nil, err
	}
	if err := a.checkAgentTenant(tenant); err != nil {
		return "", nil, nil, err
	}
	c, closeFn, err := a.client()
	if err != nil {
		return "", nil, nil, err
	}
	return tenant, c, closeFn, nil
}

func (a *app) client() (*client.Client, func(), error) {
	nc, err := a.conn.Connect()
	if err != nil {
		return nil, nil, a.explainRefusal(err)
	}
	c, err := client.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return c, nc.Close, nil
}

// adminClient is a client whose administrative requests are signed with
// the toolgate credentials it connects with (none: unsigned, for a bus
// without authentication): the control service records that operator as
// who made the change.
func (a *app) adminClient() (*client.Client, func(), error) {
	signer, err := a.conn.Signer()
	if err != nil {
		return nil, nil, err
	}
	c, closeFn, err := a.client()
	if err != nil {
		return nil, nil, err
	}
	if signer != nil {
		c.Sign = func(subject string, body []byte) (nats.Header, error) {
			return signer.Sign(nil, subject, body, time.Now())
		}
	}
	return c, closeFn, nil
}

// subcommand is the Args of a command that only groups others: an argument
// that names none of them is an unknown command.
func subcommand(cmd *cobra.Command, args []string) error {
	if len(args) != 0 {
		msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
		if cmd.SuggestionsMinimumDistance <= 0 {
			cmd.SuggestionsMinimumDistance = 2 // cobra's default, set only on the root
		}
		if near := cmd.SuggestionsFor(args[0]); len(near) > 0 {
			msg += "; did you mean " + strings.Join(near, ", ") + "?"
		}
		return usageErr("%s", msg)
	}
	return nil
}

// groupsCheckArgs makes every command that only groups others check its
// arguments (subcommand) and show its help when given none: cobra would show
// the help for an unknown subcommand too, and exit 0.
func groupsCheckArgs(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		if c.HasSubCommands() && !c.Runnable() {
			c.Args = subcommand
			c.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
		}
		groupsCheckArgs(c)
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
