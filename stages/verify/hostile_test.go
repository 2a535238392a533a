package verify

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/cputime"
)

// TestHostileShapes: results built against the stage (a MiB of one
// character, invalid UTF-8, ten thousand tiny members, deep nesting) go
// through without a panic and within a bound on CPU time per KiB; a result
// nested past MaxResultDepth is refused before it is scanned.
func TestHostileShapes(t *testing.T) {
	v, _ := setup(t, Config{})
	var fields strings.Builder
	fields.WriteString("{")
	for i := range 10000 {
		if i > 0 {
			fields.WriteString(",")
		}
		fields.WriteString(`"f` + strconv.Itoa(i) + `":"v"`)
	}
	fields.WriteString("}")
	const mib = 1 << 20
	// The bounds catch superlinear work, with room for a loaded machine;
	// they are not the detectors' goals (BenchmarkDetectors): the stage
	// also decodes, re-encodes and validates, and a document of tiny
	// members costs a scan per member.
	shapes := map[string]struct {
		result string
		perKiB time.Duration
	}{
		"one character":     {`{"s":"` + strings.Repeat("a", mib-16) + `"}`, 1000 * time.Microsecond},
		"one digit":         {`{"s":"` + strings.Repeat("7", mib-16) + `"}`, 1000 * time.Microsecond},
		"one quote":         {`{"s":"` + strings.Repeat(`\"`, mib/2-16) + `"}`, 1000 * time.Microsecond},
		"invalid UTF-8":     {`{"s":"` + strings.Repeat("\xff\xfe\xc3", mib/3-16) + `"}`, 2000 * time.Microsecond},
		"ten thousand tiny": {fields.String(), 8000 * time.Microsecond},
		"nested to the limit": {strings.Repeat(`{"a":`, MaxResultDepth) + `"x"` + strings.Repeat("}", MaxResultDepth),
			2000 * time.Microsecond},
	}
	for name, c := range shapes {
		t.Run(name, func(t *testing.T) {
			start := cputime.Process()
			_, _ = v.Process(context.Background(), invoke(c.result))
			used := cputime.Process() - start
			kib := float64(len(c.result)) / 1024
			t.Logf("%d bytes: %.1f µs/KiB of CPU", len(c.result), float64(used.Microseconds())/kib)
			// A fixed allowance covers the per-call work a small result
			// is mostly made of.
			if bound := 20*time.Millisecond + time.Duration(float64(c.perKiB)*kib); used > bound && !raceEnabled {
				t.Errorf("%v of CPU for %.0f KiB, over %v", used, kib, bound)
			}
		})
	}
	for _, deep := range []string{
		strings.Repeat(`{"a":`, 5000) + `"x"` + strings.Repeat("}", 5000),
		strings.Repeat(`[`, 9000) + strings.Repeat("]", 9000),
		`{"s":"` + strings.Repeat("[", 9000) + `"}`, // in a string: not nesting
	} {
		start := cputime.Process()
		_, err := v.Process(context.Background(), invoke(deep))
		refused := errors.Is(err, &api.Error{Code: api.ToolExecutionError, ECode: api.EOutputTooDeep})
		if refused == strings.HasPrefix(deep, `{"s"`) {
			t.Errorf("%.20s…: %v", deep, err)
		}
		if used := cputime.Process() - start; used > time.Second && !raceEnabled {
			t.Errorf("%.20s…: %v of CPU", deep, used)
		}
	}
}
