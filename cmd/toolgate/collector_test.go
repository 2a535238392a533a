package main

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/spf13/pflag"
)

func TestSetGCPercent(t *testing.T) {
	old := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(old) })

	if v, ok := os.LookupEnv("GOGC"); ok {
		t.Cleanup(func() { os.Setenv("GOGC", v) })
	}
	os.Unsetenv("GOGC")
	setGCPercent(defaultGCPercent)
	if got := debug.SetGCPercent(100); got != defaultGCPercent {
		t.Errorf("without GOGC: collector at %d%%, want the flag's %d%%", got, defaultGCPercent)
	}

	t.Setenv("GOGC", "100")
	setGCPercent(defaultGCPercent)
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("with GOGC set: collector at %d%%, want GOGC's 100%% left alone", got)
	}
}

// TestMemoryLimit: the flag's figure wins, -1 is none, and by default a
// container's memory limit holds the heap under 90% of it; an unbounded
// cgroup, or none, sets no limit.
func TestMemoryLimit(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	v2, v1 := file("memory.max", "1073741824\n"), file("limit_in_bytes", "2147483648\n")
	unbounded, v1none := file("max", "max\n"), file("v1none", "9223372036854771712\n")
	missing := filepath.Join(dir, "missing")
	for _, c := range []struct {
		mib   int64
		files []string
		want  int64
	}{
		{512, []string{v2}, 512 << 20},
		{-1, []string{v2}, 0},
		{0, []string{v2, v1}, 966367641},
		{0, []string{missing, v1}, 1932735283},
		{0, []string{unbounded, v1}, 0},
		{0, []string{v1none}, 0},
		{0, []string{missing}, 0},
	} {
		if got := memoryLimit(c.mib, c.files); got != c.want {
			t.Errorf("memoryLimit(%d, %v) = %d, want %d", c.mib, c.files, got, c.want)
		}
	}
}

// TestCollectorFlags: the flags set the collector unless GOGC and
// GOMEMLIMIT say otherwise.
func TestCollectorFlags(t *testing.T) {
	oldPercent, oldLimit := debug.SetGCPercent(100), debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetGCPercent(oldPercent); debug.SetMemoryLimit(oldLimit) })
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	os.Unsetenv("GOGC")
	os.Unsetenv("GOMEMLIMIT")
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	f := gcFlag(fs)
	if err := fs.Parse([]string{"--memory-limit-mib", "700"}); err != nil {
		t.Fatal(err)
	}
	f.apply()
	if got := debug.SetGCPercent(100); got != defaultGCPercent {
		t.Errorf("collector at %d%%, want the default %d%%", got, defaultGCPercent)
	}
	if got := debug.SetMemoryLimit(math.MaxInt64); got != 700<<20 {
		t.Errorf("memory limit %d, want the flag's %d", got, 700<<20)
	}

	t.Setenv("GOMEMLIMIT", "1GiB")
	f.apply()
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Errorf("with GOMEMLIMIT set: limit %d, want the runtime's left alone", got)
	}
}
