// Command toolgate is the tool-execution layer for AI agents: one binary that
// serves the pipeline, runs single stages, and talks to a running toolgate.
//
// This package only parses the command line and wires it to the packages
// that do the work; see docs/cli.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/toolgate/toolgate/internal/sandbox"
)

func main() {
	sandbox.ForwarderMain() // networked sandboxes run this binary as their egress forwarder
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
