package main

import (
	"testing"
	"time"
)

func TestParseSync(t *testing.T) {
	for _, c := range []struct {
		in       string
		always   bool
		interval time.Duration
		ok       bool
	}{
		{"always", true, 0, true},
		{"interval", false, 0, true},
		{"10s", false, 10 * time.Second, true},
		{"0s", false, 0, false},
		{"sometimes", false, 0, false},
	} {
		always, interval, err := parseSync(c.in)
		if (err == nil) != c.ok || always != c.always || interval != c.interval {
			t.Errorf("parseSync(%q) = %v, %v, %v", c.in, always, interval, err)
		}
	}
}
