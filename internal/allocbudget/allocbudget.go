// Package allocbudget holds hot paths' allocations per call to budgets
// recorded as data beside their tests. Allocation counts, unlike times, are
// stable on a shared machine, so a test can fail on them.
package allocbudget

import (
	"maps"
	"slices"
	"testing"
)

// Tolerance is how far a count may grow past its budget before Check fails.
const Tolerance = 0.20

// Runs is how many calls a count is the average of.
const Runs = 200

// Exceeds reports whether got allocations per call are over budget by more
// than Tolerance.
func Exceeds(got, budget float64) bool { return got > budget*(1+Tolerance) }

// Check measures each path with testing.AllocsPerRun and fails t for every
// one that exceeds its budget (Exceeds), and for a path without a budget or
// a budget without a path. It logs the counts, so recording a new budget is
// reading the log. Under the race detector, whose instrumentation
// allocates, it only runs the paths once.
func Check(t *testing.T, budgets map[string]float64, paths map[string]func()) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(budgets)) {
		if paths[name] == nil {
			t.Errorf("budget %s has no path", name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(paths)) {
		run := paths[name]
		t.Run(name, func(t *testing.T) {
			budget, ok := budgets[name]
			if !ok {
				t.Fatalf("path %s has no budget", name)
			}
			run() // warm caches and pools first
			if raceEnabled {
				t.Skip("the race detector's allocations are not the path's")
			}
			got := testing.AllocsPerRun(Runs, run)
			t.Logf("%.0f allocations per call (budget %.0f)", got, budget)
			if Exceeds(got, budget) {
				t.Errorf("%.0f allocations per call, over the budget of %.0f by more than %.0f%%",
					got, budget, Tolerance*100)
			}
		})
	}
}

// Bench runs each path as a sub-benchmark reporting its allocations.
func Bench(b *testing.B, paths map[string]func()) {
	for _, name := range slices.Sorted(maps.Keys(paths)) {
		run := paths[name]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				run()
			}
		})
	}
}
