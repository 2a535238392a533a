package cputime

import (
	"testing"
	"time"
)

// TestProcessCountsWork: a busy loop of 50 ms of wall time adds CPU time.
func TestProcessCountsWork(t *testing.T) {
	before := Process()
	x := 0
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
		x++
	}
	if got := Process() - before; got < 10*time.Millisecond {
		t.Fatalf("a 50 ms busy loop (%d turns) added %v of CPU time", x, got)
	}
}
