package main

import (
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// defaultGCPercent is serve's and stage's heap growth between collections.
// The collector's CPU per call falls as the growth rises (each collection
// marks the live heap; the bytes a call allocates decide how often one
// runs): at Go's own default, 100, a saturated serve spends about as much
// on it as its costliest stage, at 400 a quarter of that, for a larger
// resident set, which a container's memory limit caps (memoryLimit).
// docs/performance.md has the figures.
const defaultGCPercent = 400

// memoryLimitShare is the share of a cgroup's memory limit the heap is
// held under by default: a higher growth must not get the process killed
// where memory is bounded; the rest is for what the heap does not count
// (stacks, the store's file buffers, the runtime's own).
const memoryLimitShare = 0.9

// cgroupLimitFiles are where a container's memory limit is read, cgroup v2
// then v1.
var cgroupLimitFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// collectorFlags are the --gc-percent and --memory-limit-mib flags of the
// long-running commands.
type collectorFlags struct {
	percent  *int
	limitMiB *int64
}

func gcFlag(fs *pflag.FlagSet) collectorFlags {
	return collectorFlags{
		percent: fs.Int("gc-percent", defaultGCPercent, "heap growth, in percent, between Go garbage collections (GOGC in the environment wins; -1: off)"),
		limitMiB: fs.Int64("memory-limit-mib", 0, "soft limit of the Go heap in MiB, under which the collector runs more often "+
			"(0: 90% of the container's (cgroup's) memory limit where one is set, else none; -1: none; GOMEMLIMIT in the environment wins)"),
	}
}

// apply sets the collector as the flags say, GOGC and GOMEMLIMIT left to
// win where set.
func (f collectorFlags) apply() {
	setGCPercent(*f.percent)
	if _, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		return
	}
	if limit := memoryLimit(*f.limitMiB, cgroupLimitFiles); limit > 0 {
		debug.SetMemoryLimit(limit)
	}
}

// setGCPercent applies percent unless GOGC is set, which the runtime has
// already applied and which an operator set on purpose.
func setGCPercent(percent int) {
	if _, ok := os.LookupEnv("GOGC"); ok {
		return
	}
	debug.SetGCPercent(percent)
}

// memoryLimit is the heap's soft limit in bytes for --memory-limit-mib
// mib, 0 for none: mib itself when positive, none when negative, and at 0
// memoryLimitShare of the first limit set in files (a cgroup's; "max" or
// a figure beyond any machine's memory is none).
func memoryLimit(mib int64, files []string) int64 {
	switch {
	case mib > 0:
		return mib << 20
	case mib < 0:
		return 0
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		// cgroup v1 says "none" with the largest page-aligned int64.
		if err != nil || n <= 0 || n >= math.MaxInt64/2 {
			return 0
		}
		return int64(float64(n) * memoryLimitShare)
	}
	return 0
}
