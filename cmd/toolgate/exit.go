package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/connect"
)

// Exit codes, documented in docs/cli.md.
const (
	exitOK        = 0   // success
	exitError     = 1   // the command or the call failed
	exitUsage     = 2   // bad command line: unknown command or flag, wrong arguments
	exitConnect   = 3   // toolgate's NATS server could not be reached
	exitDenied    = 4   // permission denied (token, policy, approval)
	exitTimeout   = 5   // the call timed out, or --wait gave up first
	exitCancelled = 6   // the call was cancelled
	exitInterrupt = 130 // interrupted (Ctrl-C, SIGTERM) before the command finished

	// The bus refused: each reason its own status, so a script can tell
	// what to fix.
	exitNotPermitted = 7  // these credentials lack the right (E3221): an agent calling an operator's endpoint
	exitExpired      = 8  // the token or credentials have expired
	exitRevoked      = 9  // the token (or one it derives from) is revoked
	exitWrongTenant  = 10 // the token is for another tenant than the one named
	exitInbox        = 11 // an agent connection without its inbox prefix (E3222)
	exitRefused      = 12 // the bus did not accept the credentials (E3223)
)

// refusalCode is the exit status of a refusal by its E-code, 0 for others.
func refusalCode(ecode string) int {
	switch ecode {
	case api.EBusNotPermitted:
		return exitNotPermitted
	case api.ETokenExpired:
		return exitExpired
	case api.ETokenRevoked:
		return exitRevoked
	case api.ETenantMismatch:
		return exitWrongTenant
	case api.EBusInbox:
		return exitInbox
	case api.EBusRefused:
		return exitRefused
	}
	return 0
}

// codeError ends a command with an exit code. With shown set the command has
// already told the user (it printed the result); nothing more is printed.
type codeError struct {
	code  int
	err   error
	shown bool
}

func (e *codeError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}
func (e *codeError) Unwrap() error { return e.err }

func usageErr(format string, args ...any) error {
	return &codeError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// statusCode is the exit code of an invocation that ended (or stands) at s.
func statusCode(s api.Status) int {
	switch s {
	case api.StatusSuccess:
		return exitOK
	case api.StatusPermissionDenied:
		return exitDenied
	case api.StatusTimeout:
		return exitTimeout
	case api.StatusCancelled:
		return exitCancelled
	case api.StatusPending, api.StatusRunning, api.StatusPendingApproval:
		return exitTimeout // still going when we stopped waiting
	}
	return exitError
}

// shownStatus is the error a command returns after printing a result with
// status s: nil on success.
func shownStatus(s api.Status) error {
	if c := statusCode(s); c != exitOK {
		return &codeError{code: c, shown: true}
	}
	return nil
}

// codeOf classifies err.
func codeOf(err error) int {
	var ce *codeError
	var conn *connect.Error
	var te *api.Error
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ce):
		return ce.code
	case errors.As(err, &te) && refusalCode(te.ECode) != 0:
		return refusalCode(te.ECode)
	case errors.As(err, &conn):
		return exitConnect
	case errors.Is(err, connect.ErrNoTenant):
		return exitUsage
	case errors.As(err, &te):
		return statusCode(api.StatusFor(te))
	case errors.Is(err, context.Canceled):
		return exitInterrupt
	case errors.Is(err, context.DeadlineExceeded):
		return exitTimeout
	case isCobraUsage(err):
		return exitUsage
	}
	return exitError
}

// isCobraUsage recognises the errors cobra returns for command lines it
// cannot parse (its flag errors are wrapped by SetFlagErrorFunc).
func isCobraUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "accepts ", "required flag", "requires at least", "requires at most", "invalid argument"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
