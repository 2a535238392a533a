package bench

import (
	"context"
	"fmt"
	"github.com/toolgate/toolgate/internal/sandbox"
	"io"
	"os/exec"
	"slices"
	"time"
)

const sandboxSamples = 100

// measureSandbox times one cli call that does nothing (`sh -c 'echo {}'`):
// started directly with os/exec, under prlimit alone (sandbox mode none),
// and under prlimit and bubblewrap (mode bwrap). The difference between the
// first and the last is what the sandbox adds to every cli invocation.
// Without bubblewrap the bwrap series is left out.
func measureSandbox(ctx context.Context) ([]Cost, error) {
	argv := []string{"sh", "-c", "echo '{}'"}
	direct := Cost{Name: "exec, no sandbox"}
	for range sandboxSamples {
		start := time.Now()
		if err := exec.CommandContext(ctx, argv[0], argv[1:]...).Run(); err != nil {
			return nil, err
		}
		direct.Samples = append(direct.Samples, time.Since(start))
	}
	series := []Cost{direct}
	modes := []string{sandbox.ModeNone}
	if sandbox.Available() == nil {
		modes = append(modes, sandbox.ModeBwrap)
	}
	for _, mode := range modes {
		c := Cost{Name: "sandbox " + mode}
		for range sandboxSamples {
			start := time.Now()
			if _, err := sandbox.Run(ctx, sandbox.Config{Mode: mode}, sandbox.Spec{Argv: argv, Limits: sandbox.Limits{Wall: 10 * time.Second}}); err != nil {
				return nil, fmt.Errorf("sandbox %s: %w", mode, err)
			}
			c.Samples = append(c.Samples, time.Since(start))
		}
		series = append(series, c)
	}
	for i := range series {
		slices.Sort(series[i].Samples)
	}
	return series, nil
}

func printSandbox(w io.Writer, cs []Cost) {
	fmt.Fprintf(w, "\ncli tool start cost (%d sequential runs of sh -c 'echo {}'):\n", sandboxSamples)
	fmt.Fprintf(w, "%-26s %9s %9s %9s\n", "series", "p50", "p99", "max")
	for _, c := range cs {
		fmt.Fprintf(w, "%-26s %9s %9s %9s\n", c.Name, ms(c.quantile(0.5)), ms(c.quantile(0.99)), ms(c.quantile(1)))
	}
	if last := cs[len(cs)-1]; len(cs) > 1 && cs[0].quantile(0.5) > 0 {
		fmt.Fprintf(w, "%-26s %9.2f %9.2f\n", "ratio "+last.Name+"/exec",
			float64(last.quantile(0.5))/float64(cs[0].quantile(0.5)), float64(last.quantile(0.99))/float64(cs[0].quantile(0.99)))
	}
}
