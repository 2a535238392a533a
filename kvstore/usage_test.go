package kvstore

import (
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
		u.Settle(fmt.Sprintf("inv-%d", i))
	}
	if len(u.Reserved) != ReservedMemory || len(u.Settled) != SettledMemory {
		t.Fatalf("%d reserved, %d settled remembered", len(u.Reserved), len(u.Settled))
	}
	if u.HasReserved("inv-0") || !u.HasReserved(fmt.Sprintf("inv-%d", ReservedMemory+9)) || !u.HasSettled("inv-10") {
		t.Fatal("memory keeps the wrong end")
	}
	b, _ := json.Marshal(u)
	if len(b) > 2200 {
		t.Fatalf("a full usage record is %d bytes", len(b))
	}
}
