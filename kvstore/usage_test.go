package kvstore

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"testing"
)

// A usage remembers what it charged by short tags, recognises records
// written with whole ids, and forgets the oldest past its memory.
func TestUsageRemembersChargedIDs(t *testing.T) {
	var u Usage
	id := "0b7e5a8c-3f1d-4e2a-9c6b-5d4f3e2a1b0c"
	u.Reserve(id)
	if !u.HasReserved(id) || u.HasReserved(id+"x") || u.HasSettled(id) {
		t.Fatalf("reserved %v", u.Reserved)
	}
	if len(u.Reserved[0]) >= len(id)/2 {
		t.Fatalf("remembered %q for %q: not shorter", u.Reserved[0], id)
	}
	if !u.Unreserve(id) || u.HasReserved(id) || u.Unreserve(id) {
		t.Fatalf("unreserve left %v", u.Reserved)
	}
	old := Usage{Reserved: []string{id}, Settled: []string{id}}
	if !old.HasReserved(id) || !old.HasSettled(id) || !old.Unreserve(id) {
		t.Fatal("a record of whole ids is not recognised")
	}
	for i := range ReservedMemory + 10 {
		u.Reserve(fmt.Sprintf("inv-%d", i))
	}
	last := fmt.Sprintf("inv-%d", ReservedMemory+9)
	if len(u.Reserved) != ReservedMemory || u.HasReserved("inv-0") || !u.HasReserved(last) {
		t.Fatalf("%d reserved remembered, keeping the wrong end", len(u.Reserved))
	}
	// The end of a call forgets its reservation: a record holds the calls
	// in flight, and the latest ends.
	for i := range ReservedMemory + 10 {
		u.Settle(fmt.Sprintf("inv-%d", i))
	}
	if len(u.Reserved) != 0 || len(u.Settled) != SettledMemory || !u.HasSettled(last) || u.HasSettled("inv-10") || !u.Charged(last) {
		t.Fatalf("%d reserved, %d settled remembered", len(u.Reserved), len(u.Settled))
	}
	b, _ := json.Marshal(u)
	if len(b) > 1200 {
		t.Fatalf("a usage record with no call in flight is %d bytes", len(b))
	}
}

// An id's tag is the same however often it is taken, from the slot that
// remembers it or afresh, also for ids that share a slot; taking it again
// costs no allocation.
func TestIDTagRemembered(t *testing.T) {
	want := func(id string) string {
		sum := sha256.Sum256([]byte(id))
		return base64.RawURLEncoding.EncodeToString(sum[:9])
	}
	for round := range 3 {
		for i := range 3 * len(recentTags) {
			id := fmt.Sprintf("inv-%d", i)
			if got := idTag(id); got != want(id) {
				t.Fatalf("round %d: tag of %s %q, want %q", round, id, got, want(id))
			}
		}
	}
	idTag("inv-again")
	if n := testing.AllocsPerRun(100, func() { idTag("inv-again") }); n != 0 {
		t.Fatalf("%v allocations to tag an id again", n)
	}
}
