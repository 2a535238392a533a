package main

import (
	"os"
	"runtime/debug"
	"testing"
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
