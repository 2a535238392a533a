package auditchain

import (
	"fmt"
	"testing"
)

// TestSpans: the sequences a checkpointer was not handed are read in as
// few batches as pay: close ones together, and past maxSpans (several
// processes' events interleaved) all at once.
func TestSpans(t *testing.T) {
	var interleaved []uint64
	for s := uint64(1); s <= 100; s += 7 {
		interleaved = append(interleaved, s)
	}
	for _, tc := range []struct {
		seqs []uint64
		want string
	}{
		{nil, "[]"},
		{[]uint64{5}, "[[5 5]]"},
		{[]uint64{5, 6, 7}, "[[5 7]]"},
		{[]uint64{5, 9}, "[[5 9]]"}, // a gap of spanGap: one batch
		{[]uint64{5, 10}, "[[5 5] [10 10]]"},
		{[]uint64{1, 2, 100, 200}, "[[1 2] [100 100] [200 200]]"},
		{interleaved, "[[1 99]]"},
	} {
		if got := fmt.Sprint(spans(tc.seqs)); got != tc.want {
			t.Errorf("spans(%v) = %s, want %s", tc.seqs, got, tc.want)
		}
	}
}
