// Package cputime reads the CPU time this process has used, the measure
// benchmarks and cost tests bound work by: the load of a shared machine
// moves it less than it moves the wall clock.
package cputime

import (
	"syscall"
	"time"
)

// Process is the user and system time this process has used, every
// goroutine's (an embedded server's included); 0 where it cannot be read.
func Process() time.Duration {
	var u syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &u) != nil {
		return 0
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
