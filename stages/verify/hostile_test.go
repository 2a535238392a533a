package verify

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's user and system time: a bound on work that the
// load of a shared machine does not move.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestHostileShapes: results built against the stage (a MiB of one
// character, deep nesting, invalid UTF-8, ten thousand tiny members) go
// through without a panic and within a bound on CPU time per KiB.
func TestHostileShapes(t *testing.T) {
	v, _ := setup(t, Config{})
	var fields strings.Builder
	fields.WriteString("{")
	for i := range 10000 {
		if i > 0 {
			fields.WriteString(",")
		}
		fields.WriteString(`"f` + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + itoa(i) + `":"v"`)
	}
	fields.WriteString("}")
	const mib = 1 << 20
	shapes := map[string]struct {
		result string
		perKiB time.Duration // the bound, CPU time per KiB
	}{
		"one character":     {`{"s":"` + strings.Repeat("a", mib-16) + `"}`, 100 * time.Microsecond},
		"one digit":         {`{"s":"` + strings.Repeat("7", mib-16) + `"}`, 100 * time.Microsecond},
		"one quote":         {`{"s":"` + strings.Repeat(`\"`, mib/2-16) + `"}`, 100 * time.Microsecond},
		"deep nesting":      {strings.Repeat(`{"a":`, 5000) + `"x"` + strings.Repeat("}", 5000), 100 * time.Microsecond},
		"deep arrays":       {strings.Repeat(`[`, 9000) + strings.Repeat("]", 9000), 100 * time.Microsecond},
		"invalid UTF-8":     {`{"s":"` + strings.Repeat("\xff\xfe\xc3", mib/3-16) + `"}`, 100 * time.Microsecond},
		"ten thousand tiny": {fields.String(), 400 * time.Microsecond},
	}
	for name, c := range shapes {
		t.Run(name, func(t *testing.T) {
			start := cpuTime()
			inv := invoke(c.result)
			_, _ = v.Process(context.Background(), inv)
			used := cpuTime() - start
			kib := float64(len(c.result)) / 1024
			t.Logf("%d bytes: %.1f µs/KiB of CPU", len(c.result), float64(used.Microseconds())/kib)
			if used > time.Duration(float64(c.perKiB)*kib) {
				t.Errorf("%v of CPU for %.0f KiB, over %v a KiB", used, kib, c.perKiB)
			}
		})
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}
