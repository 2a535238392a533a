package kvstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolgate/toolgate/kvstore"
)

// TestAgentRunsAdmitTheLimit: twenty calls of one agent claiming at once
// from two stores (two workers) against a limit of four: exactly four hold
// a lease; a released lease admits one more; a lapsed one frees its slot;
// another agent has its own.
func TestAgentRunsAdmitTheLimit(t *testing.T) {
	ctx := context.Background()
	a, js := open(t)
	b, err := kvstore.Open(ctx, js, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var held atomic.Int32
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := a
			if i%2 == 1 {
				st = b
			}
			ok, _, err := st.ClaimAgentRun(ctx, "acme", "did:agent:a", fmt.Sprint("call-", i), 4, now, time.Minute)
			if err != nil {
				t.Error(err)
			}
			if ok {
				held.Add(1)
			}
		}()
	}
	wg.Wait()
	if held.Load() != 4 {
		t.Fatalf("%d leases held, want 4", held.Load())
	}
	if ok, running, _ := a.ClaimAgentRun(ctx, "acme", "did:agent:a", "late", 4, now, time.Minute); ok || running != 4 {
		t.Fatalf("a fifth: held %v, running %d", ok, running)
	}
	if ok, _, _ := a.ClaimAgentRun(ctx, "acme", "did:agent:b", "other", 4, now, time.Minute); !ok {
		t.Fatal("another agent was refused")
	}
	// Renewing one's own lease is not a fifth.
	var mine string
	for i := range 20 {
		id := fmt.Sprint("call-", i)
		if ok, _, _ := a.ClaimAgentRun(ctx, "acme", "did:agent:a", id, 4, now, time.Minute); ok {
			mine = id
			break
		}
	}
	if mine == "" {
		t.Fatal("no holder could renew its lease")
	}
	if err := a.ReleaseAgentRun(ctx, "acme", "did:agent:a", mine); err != nil {
		t.Fatal(err)
	}
	if ok, _, _ := a.ClaimAgentRun(ctx, "acme", "did:agent:a", "late", 4, now, time.Minute); !ok {
		t.Fatal("a released slot was not given to the next call")
	}
	// A minute on, every lease not renewed has lapsed.
	if ok, running, _ := a.ClaimAgentRun(ctx, "acme", "did:agent:a", "much-later", 4, now.Add(2*time.Minute), time.Minute); !ok || running != 1 {
		t.Fatalf("after the leases lapsed: held %v, running %d", ok, running)
	}
}
