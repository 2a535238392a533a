package subjects

import (
	"strings"
	"testing"
)

// FuzzRedriveID: whatever the original's id (an agent chose it), the
// re-drive's id is a valid invocation id, distinct per depth, and its dead
// letter's subject has exactly one token per level.
func FuzzRedriveID(f *testing.F) {
	f.Add("4f1c-22", 1)
	f.Add(strings.Repeat("x", MaxIDBytes), 3)
	f.Add("a.b*>", 16)
	f.Fuzz(func(t *testing.T, root string, depth int) {
		if CheckID(root) != nil || depth < 1 || depth > 16 {
			return
		}
		id := RedriveID(root, depth)
		if err := CheckID(id); err != nil {
			t.Fatalf("RedriveID(%q, %d) = %q: %v", root, depth, id, err)
		}
		if id == RedriveID(root, depth+1) {
			t.Fatalf("depths %d and %d share id %q", depth, depth+1, id)
		}
		if got := strings.Count(DeadLetter("acme", id), "."); got != 3 {
			t.Fatalf("dead letter subject %q has %d dots", DeadLetter("acme", id), got)
		}
	})
}
