package main

import (
	"os"
	"runtime/debug"

	"github.com/spf13/pflag"
)

// defaultGCPercent is serve's and stage's heap growth between collections.
// At Go's own default, 100, a saturated serve collects about once a second
// and marks the embedded server's caches every time, which costs more CPU
// per call than most stages; at 200 the collector's share falls by about
// two thirds for a heap a third larger (docs/performance.md).
const defaultGCPercent = 200

// gcFlag is the --gc-percent flag of the long-running commands.
func gcFlag(fs *pflag.FlagSet) *int {
	return fs.Int("gc-percent", defaultGCPercent, "heap growth, in percent, between Go garbage collections (GOGC in the environment wins; -1: off)")
}

// setGCPercent applies percent unless GOGC is set, which the runtime has
// already applied and which an operator set on purpose.
func setGCPercent(percent int) {
	if _, ok := os.LookupEnv("GOGC"); ok {
		return
	}
	debug.SetGCPercent(percent)
}
