// Package kinds lists the tool kinds compiled into toolgate. Route, authorize
// and execute are all given Compiled(): the tools route sends on, what
// authorize holds a call's resources to, and what execute runs, come from
// this one list.
package kinds

import (
	"github.com/toolgate/toolgate/stages/execute/clitool"
	"github.com/toolgate/toolgate/stages/execute/httptool"
	"github.com/toolgate/toolgate/stages/execute/kind"
	"github.com/toolgate/toolgate/stages/execute/mcptool"
	"github.com/toolgate/toolgate/stages/execute/modeltool"
)

// Builtin declares the builtin kind: functions compiled into the binary,
// which the executor runs itself (New is nil).
var Builtin = kind.Kind{Name: "builtin"}

// Compiled returns the kinds this binary runs, one line each. The list is
// code, not init-time registration: it cannot be left out of a binary by
// an import that is missing, so authorize never runs without the kinds
// that tell it what a call needs. http is built before model, which shares
// its transport.
func Compiled() *kind.Registry {
	return kind.NewRegistry(
		Builtin,
		clitool.Registration,
		httptool.Registration,
		mcptool.Registration,
		modeltool.Registration,
	)
}
