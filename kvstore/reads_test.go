package kvstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// TestReadsSeenOnDirectGetKV holds the subject the bench counts key-value
// reads on to what a bucket's read really sends: one message per Get, and
// none for a write.
func TestReadsSeenOnDirectGetKV(t *testing.T) {
	nc, js := natstest.JetStream(t)
	ctx := context.Background()
	s, err := kvstore.Open(ctx, js, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var gets atomic.Int64
	sub, err := nc.Subscribe(subjects.DirectGetKV, func(*nats.Msg) { gets.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ClaimInvocation(ctx, "acme", "inv-1", 1, "d", "did:agent:a", "echo", ""); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := s.Status(ctx, "acme", "inv-1"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Status(ctx, "acme", "missing"); err == nil {
		t.Fatal("a missing record was found")
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return gets.Load() >= 4 }, "the reads seen")
	if n := gets.Load(); n != 4 {
		t.Fatalf("%d key-value reads seen on %s, want the 4 made", n, subjects.DirectGetKV)
	}
}
