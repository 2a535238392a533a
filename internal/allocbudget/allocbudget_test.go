package allocbudget

import "testing"

func TestExceeds(t *testing.T) {
	cases := []struct {
		got, budget float64
		want        bool
	}{
		{got: 10, budget: 10},
		{got: 12, budget: 10},
		{got: 12.1, budget: 10, want: true},
		{got: 5, budget: 10},
		{got: 1, budget: 0, want: true},
	}
	for _, c := range cases {
		if got := Exceeds(c.got, c.budget); got != c.want {
			t.Errorf("Exceeds(%v, %v) = %v, want %v", c.got, c.budget, got, c.want)
		}
	}
}

// TestCheck: a path within its budget passes, one over it fails.
func TestCheck(t *testing.T) {
	var sink []byte
	alloc := func() { sink = make([]byte, 64+len(sink)%2) }
	if raceEnabled {
		t.Skip("counts are not measured under the race detector")
	}
	if got := testing.AllocsPerRun(Runs, alloc); got != 1 {
		t.Fatalf("the probe allocates %v per call, want 1", got)
	}
	if Exceeds(testing.AllocsPerRun(Runs, alloc), 1) {
		t.Fatal("one allocation exceeds a budget of one")
	}
	if !Exceeds(testing.AllocsPerRun(Runs, func() { alloc(); alloc() }), 1) {
		t.Fatal("two allocations do not exceed a budget of one")
	}
}
