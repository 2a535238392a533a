package bench

import (
	"os"
	"testing"
	"time"
)

// TestProcCPU reads this process's CPU time from /proc as the shipped
// series reads serve's, and checks it against the kernel's own account.
func TestProcCPU(t *testing.T) {
	before, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	r0 := processCPU()
	x := 0
	for start := time.Now(); time.Since(start) < 300*time.Millisecond; {
		x++
	}
	after, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	got, want := after-before, processCPU()-r0
	if got < 100*time.Millisecond || got > want+50*time.Millisecond || got < want-50*time.Millisecond {
		t.Fatalf("procCPU grew %v over a busy loop, getrusage %v (x=%d)", got, want, x)
	}
}
