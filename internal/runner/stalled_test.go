package runner

import (
	"testing"
	"time"

	"github.com/toolgate/toolgate/subjects"
)

// TestStalled: a stage that has neither completed a pull request nor
// settled a message for StallAfter reports why (readiness fails on it),
// unless a worker waits on the pull iterator, which pulls by itself.
func TestStalled(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	r := &Runner{Name: subjects.Execute, Now: func() time.Time { return now }}
	if why := r.Stalled(); why != "" {
		t.Fatalf("before Run: %s", why)
	}
	r.alive()
	now = now.Add(59 * time.Second)
	if why := r.Stalled(); why != "" {
		t.Fatalf("59s after a pull: %s", why)
	}
	now = now.Add(2 * time.Second)
	if r.Stalled() == "" {
		t.Fatal("61s without a pull or a settled message: not reported")
	}
	r.waiting.Add(1)
	if why := r.Stalled(); why != "" {
		t.Fatalf("a worker waits on a live pull: %s", why)
	}
	r.waiting.Add(-1)
	r.alive()
	if why := r.Stalled(); why != "" {
		t.Fatalf("just settled a message: %s", why)
	}
}
