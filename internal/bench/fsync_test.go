package bench

import (
	"os"
	"testing"
)

// TestMeasureSync: both modes publish every message on a real store and
// report a rate.
func TestMeasureSync(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two servers")
	}
	cs, err := measureSync(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 || cs[0].Mode == cs[1].Mode {
		t.Fatalf("series %+v", cs)
	}
	for _, c := range cs {
		if c.OneAtATime <= 0 || c.InFlight <= 0 {
			t.Errorf("%s: no rate (%+v)", c.Mode, c)
		}
	}
	printSync(os.Stdout, cs)
}
